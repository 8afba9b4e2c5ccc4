# trsi/uv:<version>, standing in for ghcr.io/astral-sh/uv:<version> (a scratch image holding /uv and
# /uvx, used as `COPY --from=ghcr.io/astral-sh/uv:X /uv /uvx /bin/`): the same binaries from PyPI's `uv`.
ARG UV_VERSION=0.8.15
FROM trsi/python:3.13 AS fetch
ARG UV_VERSION
RUN pip install --no-cache-dir --target /opt/uv "uv==${UV_VERSION}" && /opt/uv/bin/uv --version
FROM scratch
COPY --from=fetch /opt/uv/bin/uv /opt/uv/bin/uvx /
