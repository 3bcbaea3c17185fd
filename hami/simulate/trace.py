"""The trace files ``hami simulate`` reads: a node list and a pod list (Alibaba's openb CSV format).

Owns :func:`read_nodes` / :func:`read_pods` (and the text forms :func:`parse_nodes` / :func:`parse_pods`),
:func:`openb_folder` (the node list and pod lists of a folder of openb files), the :class:`TraceNode` /
:class:`TracePod` values and :class:`TraceError`, which names the file, the line and the offending value.
A file whose name ends in ``.gz`` is read through gzip (the trace shipped in ``tests/data/openb/`` is),
its unpacked text held to the same size bound. Every field is checked before use: plain decimal integers
within bounds, a known ``num_gpu``/``gpu_milli`` combination (a share of one card, or whole cards), unique
node names, model names from a small alphabet. Columns the simulator does not use (times, qos, phase) are
ignored.
Must not import a Kubernetes client; pure apart from reading the named file.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MILLI = 1000  # one whole card
MAX_CARDS = 64  # cards per node, and cards per pod
MAX_CPU_MILLI = 10**9
MAX_MEMORY_MIB = 2**40
MAX_ROWS = 1_000_000
MAX_TOTAL_CARDS = 1_000_000  # the replay keeps a few (nodes x cards) arrays
MAX_BYTES = 256 * 2**20
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
_INT = re.compile(r"[0-9]{1,15}")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}")


class TraceError(ValueError):
    """A trace file that cannot be used: ``"<file>:<line>: <column> '<value>' <why>"``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceNode:
    """One node: CPU (milli) and memory (MiB) allocatable, ``gpus`` cards of ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TracePod:
    """One pod: CPU and memory requests; ``num_gpu`` cards of ``gpu_milli`` each; allowed models."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """``cpu`` (no card), ``share`` (part of one card), ``1-gpu`` / ``multi-gpu`` (whole cards)."""
        if self.num_gpu == 0:
            return "cpu"
        if self.gpu_milli < MILLI:
            return "share"
        return "1-gpu" if self.num_gpu == 1 else "multi-gpu"

    @property
    def gpu_request(self) -> int:
        """The GPU milli the pod asks for in all (what counts as arrived demand)."""
        return self.num_gpu * self.gpu_milli


KINDS = ("cpu", "share", "1-gpu", "multi-gpu")


def _rows(text: str, where: str, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    if "\x00" in text:
        raise TraceError(f"{where}: contains a NUL byte; not a CSV text file")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{where}: empty file; expected a header line {','.join(required)}")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{where}:1: missing column(s) {', '.join(missing)} (header: {','.join(header)})"
            )
        if len(set(header)) != len(header):
            raise TraceError(f"{where}:1: a column name appears twice (header: {','.join(header)})")
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise TraceError(f"{where}:{line}: {len(row)} fields, the header has {len(header)}")
            if line > MAX_ROWS + 1:
                raise TraceError(f"{where}:{line}: more than {MAX_ROWS} rows")
            yield line, dict(zip(header, (cell.strip() for cell in row), strict=True))
    except csv.Error as exc:
        raise TraceError(f"{where}:{reader.line_num}: not valid CSV: {exc}") from None


def _int(row: dict[str, str], column: str, where: str, low: int, high: int) -> int:
    text = row[column]
    if not _INT.fullmatch(text):
        raise TraceError(f"{where}: {column} {text!r} is not a non-negative whole number")
    value = int(text)
    if not low <= value <= high:
        raise TraceError(f"{where}: {column} {text!r} must be between {low} and {high}")
    return value


def _name(row: dict[str, str], column: str, where: str) -> str:
    text = row[column]
    if not _NAME.fullmatch(text):
        raise TraceError(f"{where}: {column} {text!r} is not a name (letters, digits, . _ : / -; 1-253)")
    return text


def parse_nodes(text: str, where: str = "<nodes>") -> tuple[TraceNode, ...]:
    """The node list in ``text`` (``sn,cpu_milli,memory_mib,gpu,model``); at least one node."""
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    cards = 0
    for line, row in _rows(text, where, NODE_COLUMNS):
        at = f"{where}:{line}"
        name = _name(row, "sn", at)
        if name in seen:
            raise TraceError(f"{at}: sn {name!r} appears twice")
        seen.add(name)
        gpus = _int(row, "gpu", at, 0, MAX_CARDS)
        cards += gpus
        if cards > MAX_TOTAL_CARDS:
            raise TraceError(f"{at}: more than {MAX_TOTAL_CARDS} cards in the node list")
        model = row["model"]
        if gpus and not _MODEL.fullmatch(model):
            raise TraceError(
                f"{at}: model {model!r} is not a model name (letters, digits, space . _ -; 1-64)"
            )
        nodes.append(
            TraceNode(
                name=name,
                cpu_milli=_int(row, "cpu_milli", at, 0, MAX_CPU_MILLI),
                memory_mib=_int(row, "memory_mib", at, 0, MAX_MEMORY_MIB),
                gpus=gpus,
                model=model if gpus else "",
            )
        )
    if not nodes:
        raise TraceError(f"{where}: no nodes")
    return tuple(nodes)


def parse_pods(text: str, where: str = "<pods>") -> tuple[TracePod, ...]:
    """The pod list in ``text`` (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]``)."""
    pods: list[TracePod] = []
    for line, row in _rows(text, where, POD_COLUMNS):
        at = f"{where}:{line}"
        num_gpu = _int(row, "num_gpu", at, 0, MAX_CARDS)
        milli = _int(row, "gpu_milli", at, 0, MILLI)
        if num_gpu == 0 and milli != 0:
            raise TraceError(f"{at}: gpu_milli {milli} without a card (num_gpu 0)")
        if num_gpu > 0 and milli == 0:
            raise TraceError(f"{at}: num_gpu {num_gpu} with gpu_milli 0 (a card share must be 1..1000)")
        if num_gpu > 1 and milli != MILLI:
            raise TraceError(f"{at}: gpu_milli {milli} with num_gpu {num_gpu}: only one card can be shared")
        spec: tuple[str, ...] = ()
        if row.get("gpu_spec"):
            spec = tuple(s.strip() for s in row["gpu_spec"].split("|") if s.strip())
            for model in spec:
                if not _MODEL.fullmatch(model):
                    raise TraceError(f"{at}: gpu_spec model {model!r} is not a model name")
            if num_gpu == 0:
                spec = ()
        pods.append(
            TracePod(
                name=_name(row, "name", at),
                cpu_milli=_int(row, "cpu_milli", at, 0, MAX_CPU_MILLI),
                memory_mib=_int(row, "memory_mib", at, 0, MAX_MEMORY_MIB),
                num_gpu=num_gpu,
                gpu_milli=milli,
                gpu_spec=spec,
            )
        )
    if not pods:
        raise TraceError(f"{where}: no pods")
    return tuple(pods)


def _text(path: Path) -> str:
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: not a whole gzip file: {exc}") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise TraceError(
            f"{path}: larger than {MAX_BYTES // 2**20} MiB" + (" unpacked" if path.suffix == ".gz" else "")
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_nodes(path: str | Path) -> tuple[TraceNode, ...]:
    return parse_nodes(_text(Path(path)), str(path))


def read_pods(path: str | Path) -> tuple[TracePod, ...]:
    return parse_pods(_text(Path(path)), str(path))


def trace_name(path: str | Path) -> str:
    """``openb_pod_list_gpushare40.csv`` (or ``.csv.gz``) -> ``gpushare40``; other files -> their stem
    (without ``.gz``)."""
    name = Path(path).name.removesuffix(".gz")
    return Path(name).stem.removeprefix("openb_pod_list_")


OPENB_NODES = "openb_node_list_gpu_node"
OPENB_PODS = "openb_pod_list_"


def _csv(folder: Path, stem: str) -> Path:
    found = [p for p in (folder / f"{stem}.csv", folder / f"{stem}.csv.gz") if p.is_file()]
    if len(found) != 1:
        raise TraceError(f"{folder}: {'no' if not found else 'both'} {stem}.csv or {stem}.csv.gz")
    return found[0]


def openb_folder(folder: str | Path) -> tuple[Path, dict[str, Path]]:
    """The node list and the pod lists (by :func:`trace_name`) of a folder of openb files, each ``.csv``
    or ``.csv.gz`` (``tests/data/openb/``); a folder without them, or with a file in both forms, is
    refused."""
    root = Path(folder)
    names = sorted(
        {trace_name(f) for f in root.glob(OPENB_PODS + "*") if f.name.endswith((".csv", ".csv.gz"))}
    )
    if not names:
        raise TraceError(f"{root}: no {OPENB_PODS}*.csv or {OPENB_PODS}*.csv.gz")
    return _csv(root, OPENB_NODES), {name: _csv(root, OPENB_PODS + name) for name in names}
