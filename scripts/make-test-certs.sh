#!/bin/sh
# Test certificates for TLS (docs/security.md): a CA, a server certificate for localhost / 127.0.0.1 and a
# client certificate, each valid 1 day, EC P-256 keys, written into DIR (default: ./certs):
#   ca.pem ca.key  server.pem server.key  client.pem client.key
# For testing only: real deployments take certificates from their own PKI.
set -eu
dir=${1:-certs}
mkdir -p "$dir"
cd "$dir"
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -sha256 -days 1 -subj "/CN=ina test CA" -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
for who in server client; do
    key "$who.key"
    openssl req -new -key "$who.key" -subj "/CN=ina $who" -out "$who.csr"
    if [ "$who" = server ]; then
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$who.ext"
    else
        printf 'extendedKeyUsage=clientAuth\n' > "$who.ext"
    fi
    openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -sha256 \
        -extfile "$who.ext" -out "$who.pem" 2>/dev/null
    rm -f "$who.csr" "$who.ext"
done
rm -f ca.srl
chmod 644 ca.pem server.pem client.pem
