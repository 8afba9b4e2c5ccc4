# trsi/python:3.X, standing in for the official python:3.X images (no registry here): the Debian
# suite whose python3 is 3.X, plus pip, venv, the headers, a `python` command, and pip allowed to
# install into the system interpreter (as in the official image, which has no PEP 668 marker); pip,
# setuptools and wheel reinstalled from PyPI into /usr/local so `pip install --upgrade pip` works.
ARG BASE=trsi/debian:trixie
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-pip python3-venv python3-dev \
      python-is-python3 \
 && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && python3 -m pip install --no-cache-dir --ignore-installed pip setuptools wheel \
 && rm -rf /var/lib/apt/lists/* \
 && python --version && pip --version && python -m venv /tmp/venv-check && rm -rf /tmp/venv-check
ENV PIP_ROOT_USER_ACTION=ignore LANG=C.UTF-8
CMD ["python3"]
