# trsi/debian:<suite>: trsi/base:<suite> trusting the build machine's own extra certificate authorities
# (its /usr/local/share/ca-certificates, e.g. an HTTPS proxy's), so that pip, curl and uv in task
# builds reach the package sources this machine reaches. Built by build_images.sh.
ARG BASE=trsi/base:bookworm
FROM ${BASE}
COPY certs/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
