"""Launch an inference command unmodified, with capture on, and manage it as a child.

Zero code change: the capture bootstrap reaches the child through the environment. We prepend
a directory holding only our ``sitecustomize.py`` to ``PYTHONPATH`` (never our package dirs, so
a user's own ``engine``/``capture`` modules are not shadowed) and put the settings in one
variable, ``LAYERWATCH_CAPTURE`` (JSON). Every Python process of the job (torchrun workers
too) inherits both and dumps its own rank directory. ``--dumper msit`` launches
``msit llm dump --exec ...`` instead, which makes the CANN probe write an ATB dump.

The child runs in its own session (its own process group) with stdin from /dev/null and
stdout/stderr in a log file, so it can neither garble a TUI nor read the terminal; stopping
signals the whole group and its descendants, then SIGKILLs what is left after a grace period.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import procs
from .cases import read_case_keys
from .errors import LayerwatchError
from .golden import read_golden
from .tokens import parse_tokens

ENV_SETTINGS = "LAYERWATCH_CAPTURE"
"""The one environment variable that carries the capture settings (JSON) to the child."""
SETTINGS_VERSION = 1
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
"""Holds only ``sitecustomize.py``: the only directory we ever add to a child's ``sys.path``."""
GRACE_ENV = "LAYERWATCH_GRACE"
"""Seconds between the polite signal and SIGKILL (default 5)."""


def default_grace() -> float:
    try:
        return max(0.0, float(os.environ.get(GRACE_ENV, "5")))
    except ValueError:
        return 5.0


@dataclass(frozen=True)
class CaptureOptions:
    """The command line's capture options (they mirror :class:`~.config.DumpConfig`)."""

    tokens: str | None = None
    part: str = "both"
    layers: str | None = None
    stats_only: bool = False
    last_logits: bool = False
    format: str = "layerwatch"
    seed: int | None = None
    keep_tokens: int | None = None
    """``--stats-first [--keep-tokens N]``: statistics of everything, payloads of a ring."""
    follow: str | None = None
    """A golden layerwatch dump the child follows (teacher forcing), checked here first."""
    cases: tuple[str, ...] | None = None
    """Capture only these cases (``dump --cases FILE``), read here first."""
    weights: bool = False
    entry: str | None = None
    """``module:function`` the child's bootstrap calls instead of capture (capture/autohook.py)."""

    @classmethod
    def from_args(cls, args: object) -> CaptureOptions:
        get = lambda name, default: getattr(args, name, default)  # noqa: E731
        opts = cls(
            get("tokens", None), get("part", "both") or "both", get("layers", None),
            bool(get("stats_only", False)), bool(get("last_logits", False)),
            get("format", "layerwatch") or "layerwatch", get("seed", None),
            _keep_tokens(get("stats_first", False), get("keep_tokens", None)),
            weights=bool(get("weights", False)),
        )  # fmt: skip
        if opts.tokens:
            parse_tokens(opts.tokens)  # a bad spec fails here, in the launcher, in one line
        if opts.keep_tokens is not None and (opts.stats_only or opts.format != "layerwatch"):
            raise LayerwatchError(
                "--stats-first needs tensors in the layerwatch format: "
                "drop --stats-only/--format msit"
            )
        follow = get("follow", None)
        if follow:
            if get("dumper", "layerwatch") == "msit":
                raise LayerwatchError("--follow needs layerwatch's own capture, not --dumper msit")
            golden = read_golden(follow).rank_dir.absolute()  # one line if unusable
            opts = dataclasses.replace(opts, follow=str(golden))
        if get("cases", None):
            keys = tuple(sorted(read_case_keys(get("cases", None))))
            opts = dataclasses.replace(opts, cases=keys)
        return opts

    def settings(self, out: Path) -> dict[str, object]:
        """What the bootstrap needs to build the child's ``DumpConfig``."""
        return {
            "v": SETTINGS_VERSION,
            "dump_path": str(out),
            "token_range": self.tokens,
            "tensor_part": {"in": 0, "out": 1, "both": 2}[self.part],
            "layer_name": self.layers,
            "dump_statistics_mode": 1 if self.stats_only else 2,
            "dump_last_logits": self.last_logits,
            "format": self.format,
            "seed": self.seed,
            "keep_tokens": self.keep_tokens,
            "follow": self.follow,
            "cases": None if self.cases is None else list(self.cases),
            "dump_weight": self.weights,
            "capture_pkg": str(Path(__file__).resolve().parent),
            "entry": self.entry,
        }

    def msit_flags(self) -> list[str]:
        """The matching ``msit llm dump`` options (ATB probe), or a one-line error."""
        flags = ["--type", "model", "stats" if self.stats_only else "tensor"]
        # msit's default is the first execution only (-er 0,0); ours is every token.
        ranges = parse_tokens(self.tokens).ranges if self.tokens else ((0, None),)
        flags += ["-er", ",".join(f"{lo},{1_000_000 if hi is None else hi}" for lo, hi in ranges)]
        flags += ["-stp", {"in": "0", "out": "1", "both": "2"}[self.part]]
        if self.layers:
            if any(ch in self.layers.rstrip("*") for ch in "*?["):
                raise LayerwatchError(
                    "--dumper msit takes --layers as a name prefix (msit -opname), e.g. 'Linear*'"
                )
            flags += ["-opname", self.layers.rstrip("*")]
        if self.seed is not None:
            flags += ["-seed", str(self.seed)]
        if self.keep_tokens is not None:
            raise LayerwatchError("--stats-first does not apply to --dumper msit")
        if self.last_logits or self.format != "layerwatch":
            raise LayerwatchError(
                "--last-logits/--format do not apply to --dumper msit (the ATB probe decides)"
            )
        return flags


KEEP_TOKENS = 8
"""``--stats-first`` without ``--keep-tokens``: payloads of the last 8 tokens stay."""


def _keep_tokens(stats_first: object, keep: object) -> int | None:
    """``--keep-tokens N`` implies ``--stats-first``; N must be >= 1 (one line otherwise)."""
    if keep is None:
        return KEEP_TOKENS if stats_first else None
    if not isinstance(keep, int) or keep < 1:
        raise LayerwatchError(f"--keep-tokens must be 1 or more, not {keep}")
    return keep


def capture_env(
    out: Path, options: CaptureOptions, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The child's environment: the bootstrap dir first on ``PYTHONPATH``, settings in JSON."""
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH", "")
    parts = [p for p in old.split(os.pathsep) if p and Path(p).resolve() != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *parts])
    env[ENV_SETTINGS] = json.dumps(options.settings(out))
    if options.seed is not None:
        env["PYTHONHASHSEED"] = str(options.seed)  # only takes effect at interpreter start
    return env


def msit_command(cmd: Sequence[str], out: Path, options: CaptureOptions) -> list[str]:
    """``msit llm dump --exec "<cmd>" -o OUT ...``. msit splits ``--exec`` on spaces (no
    shell), so an argument containing whitespace cannot be passed through it."""
    bad = [a for a in cmd if not a or any(ch.isspace() for ch in a)]
    if bad:
        raise LayerwatchError(
            f"msit llm dump splits --exec on spaces: cannot pass the argument {bad[0]!r}"
        )
    return ["msit", "llm", "dump", "--exec", " ".join(cmd), "-o", str(out), *options.msit_flags()]


@dataclass
class LaunchSpec:
    """One side's command and where its dump and log go."""

    cmd: Sequence[str] | str
    """An argument vector; a string only with ``shell=True``."""
    out: Path
    options: CaptureOptions = field(default_factory=CaptureOptions)
    dumper: str = "layerwatch"
    shell: bool = False
    log: Path | None = None
    """Default: ``{out}/layerwatch.log`` (watchers and readers ignore ``*.log``)."""
    env: Mapping[str, str] | None = None

    def argv(self) -> list[str]:
        if self.shell:
            text = self.cmd if isinstance(self.cmd, str) else shlex.join(self.cmd)
            argv = ["/bin/sh", "-c", text]
        else:
            argv = shlex.split(self.cmd) if isinstance(self.cmd, str) else list(self.cmd)
        if not argv or not argv[0]:
            raise LayerwatchError(
                "no command given: e.g. layerwatch dump --out DIR -- python infer.py"
            )
        if self.dumper == "msit":
            return msit_command(argv, self.out, self.options)
        return argv

    @property
    def log_path(self) -> Path:
        return self.log or self.out / "layerwatch.log"


class Child:
    """A launched command in its own process group, its output in a log file."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.stopped_by: int | None = None
        """The signal we sent to stop it, if we did."""
        self._seen: set[int] = set()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        """Start it; a command that cannot start raises :class:`LayerwatchError` at once."""
        spec = self.spec
        argv = spec.argv()
        try:
            spec.out.mkdir(parents=True, exist_ok=True)
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(spec.log_path, "wb")  # noqa: SIM115 - handed to the child, closed below
        except OSError as exc:
            raise LayerwatchError(f"cannot write to {spec.out}: {exc.strerror or exc}") from None
        env = (
            capture_env(spec.out, spec.options, spec.env)
            if spec.dumper == "layerwatch"
            else dict(spec.env or os.environ)
        )
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, close_fds=True,
            )  # fmt: skip
        except FileNotFoundError:
            hint = " (is msit installed and on PATH?)" if spec.dumper == "msit" else ""
            raise LayerwatchError(f"command not found: {argv[0]}{hint}") from None
        except PermissionError:
            raise LayerwatchError(f"command is not executable: {argv[0]}") from None
        except OSError as exc:
            raise LayerwatchError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        finally:
            log.close()
        self.started = time.monotonic()

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code once it exited, ``None`` on timeout."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    @property
    def exit_code(self) -> int | None:
        """Shell convention: the code, or 128+N when killed by signal N."""
        rc = self.poll()
        return None if rc is None else (128 - rc if rc < 0 else rc)

    def survivors(self) -> set[int]:
        """Processes of the child's group/subtree still alive (the child itself included)."""
        if self.proc is None:
            return set()
        found = procs.alive(self.proc.pid, self.proc.pid, self._seen)
        self._seen |= found
        return found

    def send(self, sig: int) -> None:
        """Forward ``sig`` to the child's whole process group and its descendants."""
        if self.proc is None:
            return
        if self.stopped_by is None:
            self.stopped_by = sig
        procs.signal_all(self.proc.pid, self.survivors(), sig)

    def stop(self, sig: int = 15, grace: float | None = None) -> int | None:
        """``sig`` to everything in the group, SIGKILL after ``grace`` s; waits until none is
        left (a few seconds at most after the SIGKILL). Idempotent."""
        if self.proc is None:
            return None
        grace = default_grace() if grace is None else grace
        if self.survivors():
            self.send(sig)
            self._wait_empty(grace)
        if self.survivors():
            procs.signal_all(self.proc.pid, self.survivors(), 9)
            self._wait_empty(5.0)
        return self.wait(5.0)

    def _wait_empty(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll()  # reap the leader so it stops counting
            if not self.survivors():
                return
            time.sleep(0.02)

    def describe(self) -> str:
        """One line: how it ended (or that it still runs), with a diagnosis when it failed."""
        rc = self.poll()
        if self.proc is None:
            return "not started"
        if rc is None:
            return f"running (pid {self.proc.pid})"
        if rc < 0:
            how = f"killed by {procs.signal_name(-rc)}"
            if self.stopped_by is None and -rc == 9:
                how += " (out of memory?)"
        else:
            how = f"exited with code {rc}"
        if rc == 0 or self.stopped_by is not None:
            return how  # a clean exit, or we stopped it: nothing to explain
        why = diagnose(self.log_tail(40))
        return f"{how}: {why}" if why else how

    def log_tail(self, lines: int = 10) -> list[str]:
        return log_tail(self.spec.log_path, lines)


def log_tail(path: Path, lines: int = 10, max_bytes: int = 16384) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


_DIAGNOSES = (
    ("File too large", "the file-size limit (ulimit -f) was reached while dumping"),
    ("[Errno 27]", "the file-size limit (ulimit -f) was reached while dumping"),
    ("file size limit reached", "the file-size limit (ulimit -f) was reached while dumping"),
    ("No space left on device", "the disk is full"),
    ("[Errno 28]", "the disk is full"),
    ("Disk quota exceeded", "the disk quota is exceeded"),
    ("layerwatch: capture disabled", "capture was disabled in the child (see the log)"),
    ("command not found", "the command was not found"),
    ("not found", "the command was not found"),
    ("MemoryError", "the child ran out of memory"),
)


def diagnose(tail: Sequence[str]) -> str:
    """A known cause found in the log's last lines, in words; else the last line itself."""
    text = "\n".join(tail)
    for needle, why in _DIAGNOSES:
        if needle in text:
            return why
    return tail[-1].strip()[:200] if tail else ""
