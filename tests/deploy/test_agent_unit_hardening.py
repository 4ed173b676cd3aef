"""deploy/systemd/haarvest-agent.service and systemd's ``MemoryDenyWriteExecute=``.

systemd implements ``MemoryDenyWriteExecute=yes`` with a seccomp filter: ``mmap`` with ``PROT_WRITE|PROT_EXEC``,
``mprotect``/``pkey_mprotect`` adding ``PROT_EXEC`` and ``shmat`` with ``SHM_EXEC`` fail with EPERM (newer systemd
and kernels ≥ 6.3 use ``PR_SET_MDWE`` to the same effect). This test installs an equivalent filter (x86_64) in a
child process and shows both sides of the decision to leave the option out of the shipped unit:

* the agent itself runs under it here (``check-config`` builds every mechanism, loads numpy/scipy/cryptography and
  signs; ctypes callbacks work through libffi's static trampolines);
* cffi callbacks (``ffi.callback``, which sensor plugins loaded by ``[[sources]] kind = "plugin"`` may use) fail with
  MemoryError, and whether libffi has static trampolines or a wheel needs an executable stack depends on the
  platform build (Raspberry Pi OS, aarch64) — a crash loop of the agent there is worse than the little the option
  adds for an interpreter without a JIT.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "haarvest-agent.service"

#: Installs the filter (no_new_privs + seccomp BPF; x86_64 syscall numbers), then runs the code given in argv[1].
_UNDER_FILTER = textwrap.dedent('''
    import ctypes, struct, sys
    LD, JEQ, AND, RET = 0x20, 0x15, 0x54, 0x06
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1              # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    ARG2 = 16 + 8 * 2                                     # low 32 bits of the third syscall argument
    rules = [(9, 2 | 4), (10, 4), (329, 4), (30, 0o100000)]  # mmap W|X, mprotect X, pkey_mprotect X, shmat SHM_EXEC
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, ALLOW), (LD, 0, 0, 0)]
    checks = []
    for nr, mask in rules:
        checks.append([(LD, 0, 0, ARG2), (AND, 0, 0, mask), (JEQ, 0, 1, mask), (RET, 0, 0, DENY), (RET, 0, 0, ALLOW)])
    offset = len(rules) + 1                               # the jumps, then one ALLOW for every other syscall
    for i, (nr, _) in enumerate(rules):
        prog.append((JEQ, offset - i - 1 + 5 * i, 0, nr))
    prog.append((RET, 0, 0, ALLOW))
    for block in checks:
        prog.extend(block)
    code = b"".join(struct.pack("HBBI", c, jt, jf, k) for c, jt, jf, k in prog)
    buf = ctypes.create_string_buffer(code)
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0                # PR_SET_NO_NEW_PRIVS
    fprog = Fprog(len(prog), ctypes.addressof(buf))
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
    exec(sys.argv[1])
''')


def _run_filtered(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _UNDER_FILTER, textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_agent_unit_leaves_memory_deny_write_execute_out():
    unit = UNIT.read_text()
    settings = [ln.strip() for ln in unit.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert not any(s.startswith("MemoryDenyWriteExecute=") for s in settings)
    assert "MemoryDenyWriteExecute" in unit  # the comment saying why
    for kept in ("NoNewPrivileges=yes", "ProtectSystem=strict", "SystemCallFilter=@system-service",
                 "LockPersonality=yes", "RestrictNamespaces=yes"):
        assert kept in settings


@pytest.mark.skipif(platform.machine() != "x86_64" or not sys.platform.startswith("linux"),
                    reason="the emulated filter uses x86_64 Linux syscall numbers")
def test_under_a_memory_deny_write_execute_filter(tmp_path):
    # the filter is active: W+X memory and adding PROT_EXEC are refused
    res = _run_filtered('''
        import ctypes, mmap
        try:
            mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            print("wx-allowed")
        except OSError:
            print("wx-denied")
        m = mmap.mmap(-1, 4096)
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mprotect(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m))), 4096, 5)
        print("mprotect-x", rc, ctypes.get_errno())
    ''')
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["wx-denied", "mprotect-x", "-1", "1"]

    # cffi callbacks need W+X memory: refused
    pytest.importorskip("cffi")
    res = _run_filtered('''
        import cffi
        ffi = cffi.FFI()
        try:
            ffi.callback("int(int)")(lambda x: x)
            print("callback-ok")
        except MemoryError:
            print("callback-refused")
    ''')
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "callback-refused"

    # the agent itself: config, every mechanism, identity, a signature; ctypes callbacks (no test reading: this
    # config's dimensions are not the system source's, and check-config fails a reading that lacks one)
    from edge_agent.config import create_secrets, load_config

    conf = tmp_path / "agent.toml"
    conf.write_text(textwrap.dedent(f'''
        device_id = "mdwe-1"
        state_dir = "{tmp_path / 'state'}"
        schedule = "interval"
        [privacy]
        epsilon = 1.0
        [ledger]
        total_cap = 10.0
        [[dimensions]]
        name = "cpu"
        kind = "numeric"
        lo = 0.0
        hi = 100.0
        [[dimensions]]
        name = "mode"
        kind = "categorical"
        k = 4
        [[sources]]
        kind = "system"
    '''))
    create_secrets(load_config(conf))
    res = _run_filtered('''
        import ctypes, sys
        assert ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)(41) == 42
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        assert len(Ed25519PrivateKey.generate().sign(b"x")) == 64
        from haarvest.cli import main
        sys.exit(main(["agent", "check-config", "-c", sys.argv[2], "--no-source-check"]))
    ''', str(conf))
    assert res.returncode == 0, res.stdout + res.stderr
    assert '"ok": true' in res.stdout
