"""Install the Debian packages the test suite needs (headless Chromium and its driver).

Runs before the tests in `make test`. It does nothing when they are already there; otherwise it
installs them with apt-get (the machines we test on run as root).
"""

import os
import shutil
import subprocess
import sys

PACKAGES = {"chromium": "chromium", "chromedriver": "chromium-driver"}


def main() -> int:
    missing = [pkg for binary, pkg in PACKAGES.items() if shutil.which(binary) is None]
    if not missing:
        return 0
    if os.geteuid() != 0:
        print(
            f"Browser tests need {', '.join(missing)}: run "
            f"`sudo apt-get install {' '.join(missing)}` and try again.",
            file=sys.stderr,
        )
        return 1
    print(f"Installing {', '.join(missing)} for the browser tests ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
