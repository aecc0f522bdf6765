"""Random-access record sources over local files, for grain pipelines.

Each source has ``len()`` and ``source[i] -> dict`` (grain's ``RandomAccessDataSource``
protocol), reads one record at a time and never loads a whole file:

- :class:`JsonlSource`: one JSON object per line. Opening scans the file once in 1 MiB chunks
  and keeps only the byte offsets of the lines (16 bytes per row); a record is read with
  ``os.pread`` (thread-safe, no shared file position). Blank lines are not records.
- :class:`ParquetSource`: row groups are read on demand (the last one is cached).
- :class:`ArrowSource`: a folder written by HF ``datasets``' ``save_to_disk`` (Arrow stream
  files, memory-mapped; a ``DatasetDict`` folder needs ``split=``).

Every record carries where it came from under the key ``"__where__"`` (``"file.jsonl:17"``,
1-based line; ``"file.parquet:row 17"``) so that later errors (a missing field, a prompt too
long) can name the file and line. A line that is not valid JSON (or not an object) raises
:class:`DataError` with file and line, or, with ``on_error="skip"``, becomes a
:class:`Malformed` marker that the pipeline skips and counts.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DataError", "Malformed", "JsonlSource", "ParquetSource", "ArrowSource", "ListSource", "open_source",
           "WHERE"]

WHERE = "__where__"


class DataError(ValueError):
    """A malformed input file or row; the message names the file and line (or row)."""


@dataclasses.dataclass(frozen=True)
class Malformed:
    """A record that could not be read (kept in place so indices and resumption stay exact)."""

    where: str
    reason: str


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


class JsonlSource:
    """Records of one or more JSON-lines files (see the module docstring)."""

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike], *, on_error: str = "raise"):
        _check_on_error(on_error)
        self.paths = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        if not self.paths:
            raise ValueError("JsonlSource needs at least one path")
        self.on_error = on_error
        starts, ends, lines, file_ids = [], [], [], []
        for fid, path in enumerate(self.paths):
            if not path.is_file():
                raise FileNotFoundError(f"no such data file: {path}")
            s, e, ln = self._index(path)
            starts.append(s), ends.append(e), lines.append(ln), file_ids.append(np.full(len(s), fid, np.int32))
        self._start = np.concatenate(starts)
        self._end = np.concatenate(ends)
        self._line = np.concatenate(lines)
        self._file = np.concatenate(file_ids)
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    @staticmethod
    def _index(path: Path, chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Byte ranges and 1-based line numbers of the non-blank lines, in one streaming pass."""
        newlines = []
        size = 0
        with open(path, "rb") as f:
            while True:
                buf = f.read(chunk)
                if not buf:
                    break
                newlines.append(np.flatnonzero(np.frombuffer(buf, np.uint8) == 10) + size)
                size += len(buf)
        nl = np.concatenate(newlines) if newlines else np.zeros(0, np.int64)
        starts = np.concatenate([[0], nl + 1]).astype(np.int64)
        ends = np.concatenate([nl, [size]]).astype(np.int64)  # exclusive, without the newline
        keep = ends > starts  # drop empty lines (and the empty tail after a final newline)
        line = np.arange(1, len(starts) + 1, dtype=np.int64)
        starts, ends, line = starts[keep], ends[keep], line[keep]
        if len(starts):  # whitespace-only lines are blank too (checked cheaply on short lines only)
            short = np.flatnonzero(ends - starts <= 8)
            if len(short):
                with open(path, "rb") as f:
                    blank = np.zeros(len(starts), bool)
                    for i in short:
                        f.seek(starts[i])
                        blank[i] = not f.read(int(ends[i] - starts[i])).strip()
                starts, ends, line = starts[~blank], ends[~blank], line[~blank]
        return starts, ends, line

    def __len__(self) -> int:
        return len(self._start)

    def _fd(self, fid: int) -> int:
        if self._pid != os.getpid():  # forked into a grain worker: descriptors are per process
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(fid)
        if fd is None:
            fd = self._fds[fid] = os.open(self.paths[fid], os.O_RDONLY)
        return fd

    def where(self, index: int) -> str:
        return f"{self.paths[self._file[index]]}:{int(self._line[index])}"

    def __getitem__(self, index: int) -> dict | Malformed:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} out of range for {len(self)} records")
        index %= len(self)
        start, end = int(self._start[index]), int(self._end[index])
        raw = os.pread(self._fd(int(self._file[index])), end - start, start)
        where = self.where(index)
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
        except (ValueError, UnicodeDecodeError) as e:
            if self.on_error == "skip":
                return Malformed(where, f"invalid JSON: {e}")
            raise DataError(f"{where}: invalid JSON ({e}): {raw[:120]!r}") from None
        rec[WHERE] = where
        return rec

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fds"] = {}
        return state

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


class ParquetSource:
    """Records of one or more Parquet files, read a row group at a time (needs ``pyarrow``)."""

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike]):
        import pyarrow.parquet as pq

        self.paths = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self._groups: list[tuple[int, int, int]] = []  # (file, row group, first global row)
        total = 0
        for fid, path in enumerate(self.paths):
            if not path.is_file():
                raise FileNotFoundError(f"no such data file: {path}")
            try:
                meta = pq.ParquetFile(path).metadata
            except Exception as e:  # noqa: BLE001 - re-raised with the file name
                raise DataError(f"{path}: not a readable Parquet file ({e})") from None
            for g in range(meta.num_row_groups):
                self._groups.append((fid, g, total))
                total += meta.row_group(g).num_rows
        self._firsts = [g[2] for g in self._groups]
        self._len = total
        self._cache: tuple[int, list[dict]] | None = None
        self._files: dict[int, Any] = {}

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict:
        import pyarrow.parquet as pq

        index = int(index)
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range for {self._len} records")
        k = bisect.bisect_right(self._firsts, index) - 1
        fid, g, first = self._groups[k]
        cache = self._cache  # one local reference: safe when grain reads from several threads
        if cache is None or cache[0] != k:
            f = self._files.get(fid)
            if f is None:
                f = self._files[fid] = pq.ParquetFile(self.paths[fid])
            cache = self._cache = (k, f.read_row_group(g).to_pylist())
        rec = dict(cache[1][index - first])
        rec[WHERE] = f"{self.paths[fid]}:row group {g}, row {index - first}"
        return rec

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_files"], state["_cache"] = {}, None
        return state


class ArrowSource:
    """A folder saved by HF ``datasets`` (``save_to_disk``): its Arrow stream files are
    memory-mapped, not read into memory. For a ``DatasetDict`` folder pass ``split``."""

    def __init__(self, folder: str | os.PathLike, split: str | None = None):
        import pyarrow as pa

        folder = Path(folder)
        if (folder / "dataset_dict.json").is_file():
            splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
            if split is None or split not in splits:
                raise ValueError(f"{folder} is a DatasetDict with splits {splits}: pass split= one of them"
                                 + ("" if split is None else f" (got {split!r})"))
            folder = folder / split
        state = folder / "state.json"
        if not state.is_file():
            raise DataError(f"{folder}: not a saved HF dataset (no state.json)")
        files = [folder / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        self.folder = folder
        self._paths = files
        self._tables = []
        for f in files:
            try:
                self._tables.append(pa.ipc.open_stream(pa.memory_map(str(f), "r")).read_all())
            except Exception as e:  # noqa: BLE001 - re-raised with the file name
                raise DataError(f"{f}: not a readable Arrow stream ({e})") from None
        self._firsts = list(np.cumsum([0] + [t.num_rows for t in self._tables[:-1]]))
        self._len = sum(t.num_rows for t in self._tables)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict:
        index = int(index)
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range for {self._len} records")
        k = bisect.bisect_right(self._firsts, index) - 1
        row = index - self._firsts[k]
        rec = self._tables[k].slice(row, 1).to_pylist()[0]
        rec[WHERE] = f"{self._paths[k]}:row {row}"
        return rec

    def __getstate__(self):  # re-map in a worker process
        return {"folder": self.folder}

    def __setstate__(self, state):
        self.__init__(state["folder"])


class ListSource:
    """In-memory records (e.g. rows of a built-in task), with ``"__where__"`` = ``name:index``."""

    def __init__(self, rows: Sequence[dict], name: str = "rows"):
        self.rows, self.name = list(rows), name

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        rec = dict(self.rows[int(index)])
        rec[WHERE] = f"{self.name}:{int(index)}"
        return rec


def open_source(path: str | os.PathLike | Sequence[str | os.PathLike], *, split: str | None = None,
                on_error: str = "raise"):
    """A source for ``path``: ``.jsonl``/``.json`` lines, ``.parquet``, or an HF ``datasets``
    folder; a folder of ``.jsonl`` or ``.parquet`` files is read in sorted order (``split``
    selects files whose name starts with it, e.g. ``train-00000-of-00002.parquet``)."""
    _check_on_error(on_error)
    if not isinstance(path, (str, os.PathLike)):
        paths = [Path(p) for p in path]
        suffixes = {p.suffix for p in paths}
        if suffixes <= {".jsonl", ".json"}:
            return JsonlSource(paths, on_error=on_error)
        if suffixes == {".parquet"}:
            return ParquetSource(paths)
        raise ValueError(f"cannot mix file types {sorted(suffixes)} in one source")
    p = Path(path)
    if p.is_dir():
        if (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
            return ArrowSource(p, split=split)
        for ext in (".jsonl", ".parquet"):
            files = sorted(f for f in p.rglob(f"*{ext}") if split is None or f.name.startswith(split)
                           or f.parent.name == split)
            if files:
                return open_source(files, on_error=on_error)
        raise DataError(f"{p}: no .jsonl, .parquet or saved HF dataset found"
                        + (f" for split {split!r}" if split else ""))
    if not p.exists():
        raise FileNotFoundError(f"no such data file or folder: {p}")
    if p.suffix in (".jsonl", ".json"):
        return JsonlSource(p, on_error=on_error)
    if p.suffix == ".parquet":
        return ParquetSource(p)
    raise ValueError(f"{p}: unknown data format {p.suffix!r} (use .jsonl, .parquet or a saved HF dataset folder)")
