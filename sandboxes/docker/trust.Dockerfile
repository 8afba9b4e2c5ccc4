# trsi/debian:<suite>: trsi/base:<suite> trusting the build machine's own extra certificate authorities
# (its /usr/local/share/ca-certificates, e.g. an HTTPS proxy's), so that pip, curl and uv in task
# builds reach the package sources this machine reaches. COMPAT ("name:dep1,dep2 ...") adds a local
# apt source of transitional packages for names the stood-in image's archive has and this suite
# dropped (e.g. bookworm's libgl1-mesa-glx on trixie). Built by build_images.sh.
ARG BASE=trsi/base:bookworm
FROM ${BASE}
ARG COMPAT=""
COPY certs/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
RUN set -e; [ -n "$COMPAT" ] || exit 0; mkdir -p /opt/trsi-apt; cd /opt/trsi-apt; \
    for spec in $COMPAT; do name=${spec%%:*}; deps=$(echo "${spec#*:}" | sed 's/,/, /g'); \
      mkdir -p "$name/DEBIAN"; \
      printf 'Package: %s\nVersion: 0trsi1\nArchitecture: all\nMaintainer: trsi <trsi@localhost>\nDepends: %s\nDescription: transitional stand-in for %s\n' \
        "$name" "$deps" "$name" > "$name/DEBIAN/control"; \
      dpkg-deb -b "$name" "$name.deb" >/dev/null; rm -r "$name"; \
      { dpkg-deb -f "$name.deb"; echo "Filename: ./$name.deb"; echo "Size: $(stat -c %s "$name.deb")"; \
        echo "SHA256: $(sha256sum "$name.deb" | cut -d' ' -f1)"; echo; } >> Packages; \
    done; \
    echo 'deb [trusted=yes] file:/opt/trsi-apt ./' > /etc/apt/sources.list.d/trsi-compat.list
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
