"""scripts/install_bwrap.sh (run by scripts/install.sh), against fake `bwrap`, `id`, `sudo` and `apt-get` on
PATH: it installs bubblewrap only where it is missing and it may, says so in one line, and never fails."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "install_bwrap.sh")
NEED = "the code sandbox needs it; see docs/features/multi_turn.md"
SAYS_INSTALL = "install: installing bubblewrap (bwrap) for the code sandbox: apt-get install -y -q bubblewrap\n"

# apt-get logs its argv and DEBIAN_FRONTEND; `install` fails until `update` ran when $TMPDIR/stale exists,
# and always when $TMPDIR/broken exists
APT = r"""#!/usr/bin/env bash
echo "$* DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-}" >> "$TMPDIR/apt.log"
[ "$1" = update ] && { rm -f "$TMPDIR/stale"; exit 0; }
if [ -e "$TMPDIR/broken" ]; then
    echo "Reading package lists..."; echo "E: Could not get lock /var/lib/dpkg/lock-frontend"; exit 100
fi
[ -e "$TMPDIR/stale" ] && { echo "E: Unable to locate package bubblewrap"; exit 100; }
exit 0
"""


@pytest.fixture
def fake(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "tail", "true", "rm"):
        os.symlink(shutil.which(tool), bin_dir / tool)

    def tool(name, body):
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)

    tool("apt-get", APT.split("\n", 1)[1])
    tool("id", 'echo "${FAKE_UID:-0}"\n')

    def run(uid=0, **files):
        for name in files:
            (tmp_path / name).write_text("")
        done = subprocess.run([shutil.which("bash"), SCRIPT], capture_output=True, text=True, timeout=60,
                              env={"PATH": str(bin_dir), "TMPDIR": str(tmp_path), "FAKE_UID": str(uid)})
        log = tmp_path / "apt.log"
        return done.returncode, done.stdout + done.stderr, log.read_text().splitlines() if log.exists() else []

    run.tool, run.bin = tool, bin_dir
    return run


def test_present_bwrap_is_left_alone(fake):
    fake.tool("bwrap", "exit 0\n")
    assert fake() == (0, "", [])


def test_root_installs_quietly_with_one_line(fake):
    assert fake() == (0, SAYS_INSTALL, ["install -y -q bubblewrap DEBIAN_FRONTEND=noninteractive"])


def test_stale_package_lists_are_updated_once(fake):
    assert fake(stale=True) == (0, SAYS_INSTALL, ["install -y -q bubblewrap DEBIAN_FRONTEND=noninteractive",
                                                  "update -q DEBIAN_FRONTEND=noninteractive",
                                                  "install -y -q bubblewrap DEBIAN_FRONTEND=noninteractive"])


def test_a_failed_apt_get_is_one_line_and_not_a_failure(fake):
    rc, out, log = fake(broken=True)
    assert (rc, len(log)) == (0, 3)
    assert out == SAYS_INSTALL + ("install: apt-get could not install bubblewrap (E: Could not get lock "
                                  f"/var/lib/dpkg/lock-frontend): run `apt-get install bubblewrap` yourself ({NEED})\n")


def test_non_root_uses_password_less_sudo_or_says_what_to_run(fake):
    assert fake(uid=1000) == (0, f"install: bubblewrap (bwrap) is missing: run `sudo apt-get install bubblewrap` "
                                 f"({NEED})\n", [])
    fake.tool("sudo", '[ "$1" = -n ] && shift; exec "$@"\n')
    assert fake(uid=1000) == (0, SAYS_INSTALL, ["install -y -q bubblewrap DEBIAN_FRONTEND=noninteractive"])
    fake.tool("sudo", 'echo "sudo: a password is required" >&2; exit 1\n')
    assert fake(uid=1000)[1].startswith("install: bubblewrap (bwrap) is missing: run `sudo apt-get install")


def test_without_apt_get_it_says_so(fake):
    os.remove(fake.bin / "apt-get")
    assert fake() == (0, "install: bubblewrap (bwrap) is missing and there is no apt-get: install bubblewrap with "
                         f"the system's package manager ({NEED})\n", [])


def test_install_sh_runs_it_last(tmp_path, fake):
    # install.sh against a Python stub that answers every call with success: the bwrap step runs after pip
    stub = tmp_path / "python3"
    stub.write_text('#!/usr/bin/env bash\necho "python $*" >> "$TMPDIR/apt.log"\n')
    stub.chmod(0o755)
    os.symlink(shutil.which("dirname"), fake.bin / "dirname")
    done = subprocess.run([shutil.which("bash"), os.path.join(ROOT, "scripts", "install.sh")], capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": str(fake.bin), "TMPDIR": str(tmp_path), "PYTHON": str(stub)})
    log = (tmp_path / "apt.log").read_text().splitlines()
    assert (done.returncode, done.stdout) == (0, SAYS_INSTALL)
    assert log[-1] == "install -y -q bubblewrap DEBIAN_FRONTEND=noninteractive"
    assert any(line.startswith("python -m pip install") for line in log[:-1])
