"""Install the Debian packages the test suite needs: headless Chromium and its driver (the
browser tests), and `promtool` from `prometheus` (the monitoring tests check the alert rules
with it).

Runs before the tests in `make test`. It does nothing when they are already there; otherwise it
installs them with apt-get (the machines we test on run as root).

`prometheus` is a server package: its install starts the server (invoke-rc.d, or systemd), and
in a container without an init system that start can fail the install. Only its `promtool` is
wanted, so the install runs with a policy-rc.d that forbids starting services (Debian's own way
to say so; the one there before is put back), without the package's recommends (its node
exporter is another service), and on a systemd host the service it enabled is disabled again.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The command each package brings, by which it is known to be installed.
PACKAGES = {"chromium": "chromium", "chromedriver": "chromium-driver", "promtool": "prometheus"}
# Packages installed without their recommends, and the service each would run.
SERVICES = {"prometheus": "prometheus"}
POLICY = Path("/usr/sbin/policy-rc.d")
NO_STARTS = "#!/bin/sh\n# scripts/system_deps.py: no service starts while it installs.\nexit 101\n"


def main() -> int:
    missing = [pkg for binary, pkg in PACKAGES.items() if shutil.which(binary) is None]
    if not missing:
        return 0
    if os.geteuid() != 0:
        print(
            f"The tests need {', '.join(missing)}: run `sudo apt-get install "
            f"--no-install-recommends {' '.join(missing)}` and try again.",
            file=sys.stderr,
        )
        return 1
    print(f"Installing {', '.join(missing)} for the tests ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    plain = [pkg for pkg in missing if pkg not in SERVICES]
    lean = [pkg for pkg in missing if pkg in SERVICES]
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    with services_held():
        if plain:
            subprocess.run(["apt-get", "install", "-y", "-qq", *plain], check=True, env=env)
        if lean:
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *lean],
                check=True,
                env=env,
            )
    if lean and Path("/run/systemd/system").is_dir():
        services = [SERVICES[pkg] for pkg in lean]
        subprocess.run(["systemctl", "disable", "--now", "--quiet", *services], check=False)
    return 0


@contextmanager
def services_held() -> Iterator[None]:
    """While installing: a policy-rc.d that answers 101 (forbidden) to every start, which
    invoke-rc.d and deb-systemd-invoke both ask; the one there before is put back after."""
    kept = POLICY.with_name("policy-rc.d.system-deps")
    had = POLICY.exists()
    if had:
        os.replace(POLICY, kept)
    try:
        POLICY.write_text(NO_STARTS)
        POLICY.chmod(0o755)
        yield
    finally:
        if had:
            os.replace(kept, POLICY)
        else:
            POLICY.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
