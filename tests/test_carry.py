"""Which added /usr paths the docker verifier carries (carry.py): exact lists from a docker diff;
which servers keep the agent's container for the tests (services.py): this process's real listeners."""
import os
import socket

from trsi_jax.sandbox import carry, services

PATH_DIRS = {"/usr/lib/extra/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}


def test_only_added_top_most_paths_that_shadow_no_image_command():
    diff = [{"Path": "/usr", "Kind": 0}, {"Path": "/usr/bin", "Kind": 0},
            {"Path": "/usr/bin/samtools", "Kind": 1},  # a new program: carried
            {"Path": "/usr/bin/tac", "Kind": 0},  # the image's, changed: never
            {"Path": "/usr/sbin/mkdir", "Kind": 1},  # would run before /usr/bin/mkdir: never
            {"Path": "/usr/bin/bash", "Kind": 1},  # would run before /bin/bash (no merged /usr): never
            {"Path": "/usr/lib/jvm", "Kind": 1}, {"Path": "/usr/lib/jvm/java/bin/java", "Kind": 1},  # the dir alone
            {"Path": "/usr/share/doc/samtools", "Kind": 1}, {"Path": "/usr/share/doc/samtools/copyright", "Kind": 1},
            {"Path": "/usr/lib/extra", "Kind": 1}, {"Path": "/usr/lib/extra/bin/mkdir", "Kind": 1},  # on PATH
            {"Path": "/usr/local/bin/tool", "Kind": 1},  # /usr/local is carried whole elsewhere
            {"Path": "/usr/lib/x86_64-linux-gnu/libc.so.6", "Kind": 2},  # deleted: nothing to carry
            {"Path": "/etc/foo", "Kind": 1}, {"Path": "/usrx/y", "Kind": 1}]
    commands = carry.listing_names("/usr/bin:\ntac\nmkdir\n\n/bin:\nbash\nls: cannot access '/usr/games'\n")
    assert {"tac", "mkdir", "bash"} <= commands and "/usr/bin:" not in commands
    assert carry.added_usr_paths(diff, commands, PATH_DIRS) == [
        "/usr/bin/samtools", "/usr/lib/jvm", "/usr/share/doc/samtools"]


def test_rooted_tar_names_members_from_the_root():
    import io
    import tarfile

    def tar(*members):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as t:
            for name, kind, arg in members:
                info = tarfile.TarInfo(name)
                if kind == "file":
                    info.size = len(arg)
                    t.addfile(info, io.BytesIO(arg))
                else:
                    info.type, info.linkname = (tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE), arg
                    t.addfile(info)
        return out.getvalue()

    rooted = carry.rooted_tar({"/usr/bin/x": tar(("x", "sym", "../lib/emboss/.x")),
                               "/usr/lib/emboss": tar(("emboss/.x", "file", b"hi"), ("emboss/y", "hard", "emboss/.x"))})
    with tarfile.open(fileobj=io.BytesIO(rooted)) as t:
        got = [(m.name, m.linkname) for m in t]
        assert t.extractfile("usr/lib/emboss/.x").read() == b"hi"
    assert got == [("usr/bin/x", "../lib/emboss/.x"), ("usr/lib/emboss/.x", ""), ("usr/lib/emboss/y", "usr/lib/emboss/.x")]


def test_listening_ports_are_read_from_procfs():
    """A real listening socket of this process (v4 and v6) appears in its /proc/net/tcp*; a connected
    one and a bound but not listening one do not."""
    listeners, others = [], []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family)
        s.bind((host, 0))
        s.listen()
        listeners.append(s)
        bound = socket.socket(family)
        bound.bind((host, 0))
        client = socket.create_connection((host, s.getsockname()[1]))
        others += [bound, client, s.accept()[0]]
    try:
        found = set()
        for table in ("tcp", "tcp6"):
            found |= services.listening_ports(open(f"/proc/{os.getpid()}/net/{table}").read())
        assert {s.getsockname()[1] for s in listeners} <= found
        assert not {s.getsockname()[1] for s in others[:2] + others[3:5]} & found  # bound-only and client ports
    finally:
        for s in listeners + others:
            s.close()
