"""A test PKI made with the openssl command: a CA, a server certificate
for the names a test gives and a client certificate, all valid two days.

    make_pki(d)                                  # the server is 127.0.0.1
    make_pki(d, server_names="DNS:pool.test")    # a name, no address
"""

import os
import subprocess


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_pki(d, server_names="IP:127.0.0.1"):
    """ca.pem; server.pem/key for `server_names` (its subjectAltName);
    client.pem/key (CN=engine-0)."""
    ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    openssl("genpkey", *ec, "-out", "ca.key", cwd=d)
    openssl("req", "-new", "-x509", "-days", "2", "-key", "ca.key", "-out", "ca.pem",
            "-subj", "/CN=test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    for name, ext in (("server", "subjectAltName=%s\nextendedKeyUsage=serverAuth"
                       % server_names),
                      ("client", "extendedKeyUsage=clientAuth")):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext + "\n")
        openssl("genpkey", *ec, "-out", name + ".key", cwd=d)
        openssl("req", "-new", "-key", name + ".key", "-subj",
                "/CN=%s" % ("prefixd" if name == "server" else "engine-0"),
                "-out", name + ".csr", cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-set_serial", "1" if name == "server" else "2", "-days", "2",
                "-extfile", name + ".ext", "-out", name + ".pem", cwd=d)
