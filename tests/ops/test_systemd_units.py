"""The systemd units of deploy/systemd/ (docs/deploy.md): systemd-analyze finds nothing wrong
in them and does find a broken copy wrong; each runs what the Procfile runs, so the two cannot
drift apart; and they share one layout (user, paths, stop signal, hardening).

systemd-analyze verify checks a unit's sections, directives and their values, and that its
commands exist and are executable. The units name the installed paths
(/opt/gatekeeper/.venv/bin/...), which this machine lacks, so they are verified as copies whose
commands point at this checkout's virtualenv instead: the same gunicorn and celery, installed
from the same requirements.
"""

import re
import runpy
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED_BIN = "/opt/gatekeeper/.venv/bin/"
VENV_BIN = Path(sys.executable).parent
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian: the systemd package); the units' syntax "
    "and directives are not checked",
)

# Each Procfile process, the unit that runs it in production, and the arguments the unit adds.
PROCESSES = {
    "web": ("gatekeeper-web.service", ()),
    # Two instances on one host need two node names (Celery's %h: the host name).
    "worker": ("gatekeeper-worker@.service", ("--hostname", "%i@%h")),
    "upkeep": ("gatekeeper-upkeep.service", ()),
    "beat": ("gatekeeper-beat@.service", ()),
}
# A template is verified as one of its instances.
INSTANCE = "1"
# `systemd-analyze security --offline` scores the units' hardening 3.1 ("OK") with systemd 252;
# a unit that lost some of it scores higher.
EXPOSURE_AT_MOST = 3.5


def unit_names() -> list[str]:
    return sorted(path.name for path in UNITS.glob("*.service"))


def entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of a unit file, in order, as systemd reads them: comments dropped,
    continued lines joined; a key may come several times."""
    found: list[tuple[str, str, str]] = []
    section = ""
    logical = text.replace("\\\n", " ")
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def values(name: str, section: str, key: str) -> list[str]:
    text = (UNITS / name).read_text()
    return [value for s, k, value in entries(text) if (s, k) == (section, key)]


def value(name: str, section: str, key: str) -> str:
    found = values(name, section, key)
    assert len(found) == 1, f"{name}: [{section}] {key}= set {len(found)} times"
    return found[0]


def procfile() -> dict[str, list[str]]:
    """Each Procfile process's arguments, the program by its name (`.venv/bin/celery`:
    `celery`) and a variable with a default (`${WORKER_CONCURRENCY:-2}`) by its name alone,
    as systemd writes it."""
    processes = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, command = line.partition(":")
        words = shlex.split(command)
        words[0] = Path(words[0]).name
        processes[name.strip()] = [re.sub(r"\$\{(\w+):-[^}]*\}", r"${\1}", w) for w in words]
    return processes


def exec_start(name: str) -> list[str]:
    """A unit's command as the program's name and its arguments, systemd's `%%` read as `%`."""
    words = shlex.split(value(name, "Service", "ExecStart").lstrip("-@+!:"))
    assert words[0].startswith(INSTALLED_BIN), f"{name} runs {words[0]}, not from {INSTALLED_BIN}"
    words[0] = words[0].removeprefix(INSTALLED_BIN)
    return [w.replace("%%", "%") for w in words]


def installed_like(directory: Path, rewrite: dict[str, str] | None = None) -> Path:
    """Copies of every unit in `directory`, their commands taken from this checkout's
    virtualenv; `rewrite` maps a unit's name to its broken text."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in UNITS.iterdir():
        if path.suffix in (".service", ".target"):
            text = (rewrite or {}).get(path.name, path.read_text())
            (directory / path.name).write_text(text.replace(INSTALLED_BIN, f"{VENV_BIN}/"))
    return directory


def as_loaded(name: str) -> str:
    """The unit name to verify: a template as one of its instances."""
    return name.replace("@.", f"@{INSTANCE}.")


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60)


@cache
def analyze_options() -> tuple[str, ...]:
    """--man=no: Documentation= is a file, not a man page. --recursive-errors=no (systemd 250 and
    later): only these units' problems fail the verification, not the host's units'."""
    usage = analyze("--help").stdout
    return ("--man=no", *(["--recursive-errors=no"] if "--recursive-errors" in usage else []))


def verify(directory: Path, *names: str) -> list[str]:
    """What systemd-analyze verify says is wrong with the units `names` of `directory`: its
    lines about them (a directive it cannot parse is only a warning, with exit status 0), and
    everything it said when it failed."""
    done = analyze("verify", *analyze_options(), *(str(directory / n) for n in names))
    said = (done.stdout + done.stderr).splitlines()
    ours = [line for line in said if "gatekeeper" in line]
    if done.returncode != 0:
        return ours or said or [f"systemd-analyze verify exited with {done.returncode}"]
    return ours


# --- what systemd says ------------------------------------------------------------------------


@needs_systemd_analyze
@pytest.mark.parametrize("name", [*unit_names(), "gatekeeper.target"])
def test_systemd_analyze_verify_finds_nothing_wrong_with_the_unit(tmp_path, name):
    for program in ("gunicorn", "celery"):
        assert (VENV_BIN / program).exists(), f"{program} is not installed in {VENV_BIN}"
    copies = installed_like(tmp_path / "units")
    assert verify(copies, as_loaded(name)) == []


BREAKAGES = {
    "a misspelled directive": ("Restart=on-failure", "Restrat=on-failure", "Unknown key"),
    "a value systemd cannot parse": ("KillSignal=SIGTERM", "KillSignal=SIGSTOPPED", "signal"),
    "a service type that does not exist": ("Type=notify", "Type=notified", "service type"),
    "a broken section header": ("[Service]", "[Service", "section header"),
    "a program that is not installed": (
        "bin/gunicorn --config",
        "bin/gunicorn3 --config",
        "not executable",
    ),
}


@needs_systemd_analyze
@pytest.mark.parametrize("breakage", BREAKAGES, ids=list(BREAKAGES))
def test_systemd_analyze_verify_fails_a_broken_unit(tmp_path, breakage):
    good, bad, said = BREAKAGES[breakage]
    text = (UNITS / "gatekeeper-web.service").read_text()
    assert good in text
    broken = text.replace(good, bad, 1)
    copies = installed_like(tmp_path / "units", {"gatekeeper-web.service": broken})
    problems = verify(copies, "gatekeeper-web.service")
    assert problems, f"{breakage} went unnoticed"
    assert any(said in line for line in problems), problems


@needs_systemd_analyze
@pytest.mark.parametrize("name", unit_names())
def test_the_units_hardening_keeps_their_exposure_low(tmp_path, name):
    copies = installed_like(tmp_path / "units")
    done = analyze("security", "--offline=yes", str(copies / as_loaded(name)))
    if done.returncode != 0 and "--offline" in done.stderr:
        pytest.skip("this systemd-analyze cannot score unit files offline (systemd < 250)")
    assert done.returncode == 0, done.stdout + done.stderr
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert level, done.stdout
    assert float(level.group(1)) <= EXPOSURE_AT_MOST, done.stdout


# --- the units and the Procfile -----------------------------------------------------------


def test_every_procfile_process_has_its_unit_and_every_unit_a_process():
    assert set(procfile()) == set(PROCESSES)
    assert sorted(unit for unit, _ in PROCESSES.values()) == unit_names()


@pytest.mark.parametrize("process", PROCESSES)
def test_the_unit_runs_the_procfile_command(process):
    name, added = PROCESSES[process]
    command = exec_start(name)
    if added:
        starts = [i for i in range(len(command)) if tuple(command[i : i + len(added)]) == added]
        assert starts, f"{name} lacks {' '.join(added)}"
        del command[starts[0] : starts[0] + len(added)]
    assert command == procfile()[process]


@pytest.mark.parametrize("name", unit_names())
def test_every_variable_of_a_command_has_a_default_in_its_unit(name):
    """A variable the environment file leaves unset would be an empty argument."""
    used = set(re.findall(r"\$\{(\w+)\}", value(name, "Service", "ExecStart")))
    defaults = {v.partition("=")[0] for v in values(name, "Service", "Environment")}
    assert used <= defaults


# --- what every unit shares -----------------------------------------------------------------


HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "CapabilityBoundingSet": "",
}


@pytest.mark.parametrize("name", unit_names())
def test_every_unit_runs_as_installed_and_stops_with_sigterm(name):
    assert value(name, "Service", "User") == "gatekeeper"
    assert value(name, "Service", "WorkingDirectory") == "/opt/gatekeeper"
    assert "/etc/gatekeeper/gatekeeper.env" in values(name, "Service", "EnvironmentFile")
    assert value(name, "Service", "Restart") == "on-failure"
    # SIGTERM to the main process alone: gunicorn's graceful stop, Celery's warm shutdown.
    assert value(name, "Service", "KillSignal") == "SIGTERM"
    assert value(name, "Service", "KillMode") == "mixed"
    for key, expected in HARDENING.items():
        assert value(name, "Service", key) == expected, key
    assert value(name, "Unit", "PartOf") == "gatekeeper.target"
    assert value(name, "Install", "WantedBy") == "gatekeeper.target"


@pytest.mark.parametrize("name", unit_names())
def test_only_beat_may_not_write_to_var(name):
    writable = values(name, "Service", "ReadWritePaths")
    assert writable == ([] if name.startswith("gatekeeper-beat@") else ["/opt/gatekeeper/var"])


def test_the_web_unit_waits_longer_than_gunicorns_graceful_stop():
    from gunicorn.config import Config

    conf = runpy.run_path(str(ROOT / "gatekeeper" / "gunicorn_conf.py"))
    graceful = float(conf.get("graceful_timeout", Config().graceful_timeout))
    assert float(value("gatekeeper-web.service", "Service", "TimeoutStopSec")) > graceful


# --- the environment file -----------------------------------------------------------------


def names_read() -> set[str]:
    """Every environment variable settings.py, gunicorn's config and the units read."""
    settings = (ROOT / "gatekeeper" / "settings.py").read_text()
    gunicorn = (ROOT / "gatekeeper" / "gunicorn_conf.py").read_text()
    names = set(re.findall(r"env\.\w+\(\s*\"([A-Z][A-Z0-9_]*)\"", settings))
    names |= set(re.findall(r"os\.environ\.get\(\"([A-Z][A-Z0-9_]*)\"", gunicorn))
    for name in unit_names():
        names |= {v.partition("=")[0] for v in values(name, "Service", "Environment")}
    return names


def test_the_example_environment_sets_only_variables_gatekeeper_reads():
    example = (UNITS / "gatekeeper.env.example").read_text()
    assigned = re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", example, flags=re.MULTILINE)
    assert assigned
    unknown = {n for n in assigned if n not in names_read() and not n.startswith("ANYMAIL_")}
    assert not unknown, f"gatekeeper.env.example sets variables nothing reads: {sorted(unknown)}"
    for required in ("DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL", "GATEKEEPER_PUBLIC_URL"):
        assert required in assigned
