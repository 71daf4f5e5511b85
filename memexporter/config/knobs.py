"""The config knobs: every keyword of ``start()``, its ``MEMEXPORTER_<NAME>`` variable, its parser,
default and documentation, in one table (``KNOBS``). ``memexporter.config`` resolves them; the
configuration table of docs/configuration.md and ``memexporter run``'s options are rendered from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memexporter.config import values as kt
from memexporter.config.environment import PREFIX

ENV_PREFIX = PREFIX
DEFAULT_PORT = 9400


@dataclass(frozen=True)
class Knob:
    """One setting: its parser, default and documentation."""

    name: str
    parse: Callable[[str, object], Any]
    default: Any
    doc: str
    values: str = ""  # the values it takes, for the CLI's help (booleans are --flag/--no-flag there)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def boolean(self) -> bool:
        return self.parse is kt.boolean


KNOBS: tuple[Knob, ...] = (
    Knob(
        "port",
        kt.port,
        DEFAULT_PORT,
        "Base TCP port. Each rank binds port + LOCAL_RANK. 0 picks a free port (tests).",
        "an integer 0-65535",
    ),
    Knob(
        "addr",
        kt.addr,
        "0.0.0.0",
        "Bind address: an IP address of this host (no host names: no DNS at start). All interfaces by default, as exporters do; use 127.0.0.1 on shared login nodes.",
        "an IP address: 0.0.0.0, 127.0.0.1, ::, ::1, or localhost",
    ),
    Knob(
        "strict",
        kt.boolean,
        False,
        "Raise instead of logging when the port is taken, the server cannot start, or OTLP push cannot be set up.",
    ),
    Knob(
        "certfile",
        kt.opt_path,
        None,
        "TLS certificate (PEM). Needs keyfile; checked at start (a ValueError names a bad file).",
        "a file path",
    ),
    Knob(
        "keyfile",
        kt.opt_path,
        None,
        "TLS private key (PEM, unencrypted) matching certfile. Needs certfile.",
        "a file path",
    ),
    Knob(
        "memory_limit_bytes",
        kt.opt_bytes,
        None,
        "Soft budget that caps memory_limit_bytes for the devices the job trains on (the accelerator if any is in use, else cpu).",
        "a size > 0: bytes, or with a unit (40GiB, 512MiB, 40GB)",
    ),
    Knob(
        "leak_window", kt.window, 200, "Steps in the leak-rate window (ring buffer; 8..100000).", "an integer 8-100000"
    ),
    Knob(
        "warmup_steps",
        kt.non_negative,
        20,
        "Steps ignored at the start of the run and after a restart (allocator and cache warm-up).",
        "an integer >= 0",
    ),
    Knob(
        "max_input_elements",
        kt.opt_positive,
        None,
        "The largest step input the data can bring, in elements (memexporter_step_input_elements counts them: every tensor the model is given). Published as memexporter_input_declared_max_elements; when it exceeds the input capacity learned from the job's steps, on_oom_risk fires and MemexporterInputOverCapacity pages, before the long batch comes.",
        "an integer >= 1 (elements)",
    ),
    Knob(
        "auto_step",
        kt.boolean,
        True,
        "Count every optimizer.step() as a step boundary. memexporter.step() turns this off.",
    ),
    Knob(
        "module_depth",
        kt.positive,
        3,
        "Deepest module path reported by track(); deeper modules fold into their ancestor.",
        "an integer >= 1",
    ),
    Knob(
        "max_modules",
        kt.positive,
        100,
        "Most module rows per tracked model; the smallest fold into their parent.",
        "an integer >= 1",
    ),
    Knob(
        "auto_track",
        kt.boolean,
        False,
        "Find the model without code and export its module rows: the outermost module whose forward runs with grad enabled and whose parameters an optimizer steps, tracked from the next forward. On by default under memexporter run and the MEMEXPORTER_AUTOSTART bootstrap (which know no model); 0 turns it off there.",
    ),
    Knob(
        "otel",
        kt.boolean,
        False,
        "Push the metrics over OTLP, configured by the standard OTEL_EXPORTER_OTLP_* and OTEL_* variables (pip install 'memexporter[otel]'). start(meter_provider=...) uses the application's provider instead.",
    ),
    Knob(
        "http",
        kt.boolean,
        True,
        "Serve /metrics over HTTP, from a helper process that start() spawns (it binds the port). False (with otel) runs push-only: no port is opened, no helper started.",
    ),
    Knob(
        "end_grace",
        kt.non_negative,
        65,
        "Seconds the helper keeps serving the last snapshot after the training process ended, with memexporter_job_end_info saying how it ended; then it exits. The default covers two scrapes at a 30 s interval. 0: it exits at once.",
        "an integer >= 0 (seconds)",
    ),
    Knob(
        "debug",
        kt.boolean,
        False,
        "Serve /debug/memory (tensor census, growing groups and their holders, OOM view) and /debug/snapshot (CUDA allocator snapshot). Loopback clients only, unless debug_allow names theirs, and each request carries the job's token (written to $XDG_RUNTIME_DIR/memexporter, read by memexporter inspect).",
    ),
    Knob(
        "debug_allow",
        kt.networks,
        (),
        "Networks besides loopback allowed to read /debug/* (CIDR, comma-separated, e.g. 10.0.0.0/8); other clients get 403.",
        "CIDR networks, comma-separated",
    ),
    Knob(
        "record_history",
        kt.boolean,
        False,
        "CUDA: record allocation stack traces (torch.cuda.memory._record_memory_history, Python frames, the last 100000 events), so snapshots show who allocated each block. About 2 us per allocation (PyTorch's figure).",
    ),
    Knob(
        "oom_dump_dir",
        kt.opt_dir,
        None,
        "Directory for the pre-mortem (the census, written once when the OOM ETA drops under 5 minutes or use passes 95 % of the limit) and, on CUDA, the allocator snapshot at an OOM. Created if missing.",
        "a directory path",
    ),
    Knob(
        "census_every",
        kt.positive,
        50,
        "Steps between tensor censuses (with debug or oom_dump_dir), stretched when a census would cost more than census_budget.",
        "an integer >= 1",
    ),
    Knob(
        "census_budget",
        kt.fraction,
        0.005,
        "Most of the training time the censuses may take (0.005: 0.5 %); the census interval stretches to stay under it. 1 turns the stretching off.",
        "a number above 0, at most 1",
    ),
    Knob(
        "run_id",
        kt.label_value,
        "",
        "The training run's name on memexporter_run_info (run_id). Empty: the launcher's (TORCHELASTIC_RUN_ID unless torchrun's default none, SLURM_JOB_ID, MASTER_ADDR:MASTER_PORT, else hostname-pid).",
        "text, at most 128 characters",
    ),
    Knob(
        "log_level",
        kt.log_level,
        None,
        "Level of memexporter's own log messages (its logger, memexporter), as the commands' --log-level. Unset: start() leaves it to the application's logging configuration, and the commands say INFO and up. Set where the application configured no logging, the messages go to stderr.",
        "debug, info, warning or error (any case)",
    ),
    Knob(
        "detail_ranks",
        kt.ranks,
        "auto",
        "Ranks that export the detail (module rows, allocator detail, the forward/backward/optimizer phases) once the run has 64 ranks or more; the others export the core set the alerts read. auto: the first node's ranks (rank < LOCAL_WORLD_SIZE); below 64 ranks every rank exports everything.",
        "auto, all, none, or ranks such as 0-7,64",
    ),
)
