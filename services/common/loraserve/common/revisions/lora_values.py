"""What values a LoRA adapter may hold: finite weights and a bounded scale.

An adapter with a NaN or an infinity among its weights, or a scale that overflows,
answers garbage for every request that uses it; an engine that multiplies other
requests' rows by a zero instead of skipping them spreads that garbage to them too
(0 x NaN is NaN). The store refuses such adapters at push, adapterctl before it sends,
the inference service before it loads. The weights are checked as their bytes stream
(`WeightsFileCheck`, `DataSectionCheck`): memory stays one chunk, plus the header and
at most 7 bytes of a value split between chunks; only bytes operations, since the
store does not load numpy. Every refusal is InvalidArgument naming the file, the
tensor or the config field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.peft_format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    TensorInfo,
    load_json_object,
    parse_safetensors_header,
    safetensors_header_length,
)

# The largest |lora_alpha / r| (|lora_alpha / sqrt(r)| with use_rslora) accepted.
# Configs in common use give 0.25 (QLoRA's r 64, alpha 16) to 32 (alpha 256 at r 8);
# alpha = r or 2r, scale 1 or 2, is the usual choice. vLLM converts lora_B to the
# serving dtype and then multiplies it by the scale in that dtype: at 1024, a float16
# lora_B entry up to 64 (trained entries are far below 1) still stays under float16's
# largest value, 65504. So the bound is 32x past any scale in common use, and still
# keeps sane weights finite when served in float16.
MAX_LORA_SCALE = 1024.0


@dataclass(frozen=True, slots=True)
class _FloatLayout:
    """Where a little-endian IEEE 754 float keeps its exponent. A value is NaN or
    infinite exactly when every exponent bit is set; they sit in its two most
    significant bytes (bfloat16 is the upper half of a float32)."""

    size: int  # bytes per value
    top: int  # the exponent's bits in the most significant byte
    second: int  # the exponent's bits in the byte below it (0: none there)
    mantissa_bits: int  # below the exponent; any of them set makes a NaN

    def marks(self, mask: int) -> bytes:
        """A `bytes.translate` table: 1 for a byte with every bit of `mask` set, else 0."""
        return bytes(int(value & mask == mask) for value in range(256))


_LAYOUTS = {
    "F16": _FloatLayout(2, 0x7C, 0x00, 10),
    "BF16": _FloatLayout(2, 0x7F, 0x80, 7),
    "F32": _FloatLayout(4, 0x7F, 0x80, 23),
    "F64": _FloatLayout(8, 0x7F, 0xF0, 52),
}
_MARKS = {
    name: (layout.marks(layout.top), layout.marks(layout.second))
    for name, layout in _LAYOUTS.items()
}
# Dtypes that have no NaN or infinity to find.
_EXACT_DTYPES = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})
CHECKED_FLOAT_DTYPES = frozenset(_LAYOUTS)


def lora_scales(config: Mapping[str, Any]) -> dict[str, tuple[Any, float]]:
    """The scales PEFT and vLLM apply to lora_B @ lora_A, by the config field each comes
    from (`lora_alpha`, `alpha_pattern[<module>]`), with that field's value. The rank
    must already be a valid integer; a non-numeric alpha is InvalidArgument."""
    rank = config["r"]
    divisor = math.sqrt(rank) if config.get("use_rslora") else float(rank)
    pattern = config.get("alpha_pattern") or {}
    if not isinstance(pattern, dict):
        raise InvalidArgument(f"{CONFIG_FILE}: alpha_pattern must map module names to numbers")
    alphas = {"lora_alpha": config.get("lora_alpha")}
    alphas |= {f"alpha_pattern[{key!r}]": value for key, value in pattern.items()}
    scales = {}
    for field, alpha in alphas.items():
        if not isinstance(alpha, int | float) or isinstance(alpha, bool):
            raise InvalidArgument(f"{CONFIG_FILE}: {field} must be a number, got {alpha!r}")
        try:
            scales[field] = (alpha, alpha / divisor)
        except OverflowError:  # an integer beyond float's range
            scales[field] = (alpha, math.inf)
    return scales


def check_lora_scale(config: Mapping[str, Any]) -> None:
    """Raises InvalidArgument naming the field whose scale is not finite or is larger
    than MAX_LORA_SCALE in magnitude."""
    formula = "lora_alpha / sqrt(r)" if config.get("use_rslora") else "lora_alpha / r"
    for field, (alpha, scale) in lora_scales(config).items():
        if not math.isfinite(scale) or abs(scale) > MAX_LORA_SCALE:
            raise InvalidArgument(
                f"{CONFIG_FILE}: {field} = {alpha!r} with r = {config['r']} gives a LoRA "
                f"scale ({formula}) of {scale:g}; it must be finite and at most "
                f"{MAX_LORA_SCALE:g} in magnitude"
            )


def check_config_scale(data: bytes) -> None:
    """`check_lora_scale` of an adapter_config.json's bytes, if they hold a JSON object
    with a valid rank; any other config is left for the store's full check to refuse."""
    try:
        config = load_json_object(data, CONFIG_FILE)
    except InvalidArgument:
        return
    rank = config.get("r")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1:
        check_lora_scale(config)


def check_tensor_dtypes(tensors: Iterable[TensorInfo], file_name: str = WEIGHTS_FILE) -> None:
    """Raises InvalidArgument for a float dtype whose values cannot be checked here."""
    for tensor in tensors:
        if tensor.dtype not in _LAYOUTS and tensor.dtype not in _EXACT_DTYPES:
            raise InvalidArgument(
                f"{file_name}: tensor {tensor.name!r} has dtype {tensor.dtype}, whose values "
                f"cannot be checked for NaN and infinity; LoRA weights must be one of "
                f"{sorted(CHECKED_FLOAT_DTYPES)}"
            )


class DataSectionCheck:
    """Checks a safetensors data section, fed in order in pieces of any size, for NaN
    and infinite values; raises InvalidArgument naming the first tensor that has one."""

    def __init__(self, tensors: Iterable[TensorInfo], file_name: str = WEIGHTS_FILE) -> None:
        # parse_safetensors_header checked that the tensors tile the section exactly.
        self._tensors = sorted(tensors, key=lambda t: (t.begin, t.end))
        check_tensor_dtypes(self._tensors, file_name)
        self._file_name = file_name
        self._next = 0  # index of the tensor that holds `position`
        self.position = 0  # bytes of the data section checked or carried
        # The start of a value whose other bytes are in the next piece.
        self._carry = b""

    @property
    def end(self) -> int:
        return self._tensors[-1].end if self._tensors else 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            while self._next < len(self._tensors) and self._tensors[self._next].end <= (
                self.position
            ):
                self._next += 1
            if self._next == len(self._tensors):
                raise InvalidArgument(
                    f"{self._file_name}: {len(view)} bytes after the last tensor's data"
                )
            tensor = self._tensors[self._next]
            taken = view[: tensor.end - self.position]
            self._check(tensor, taken)
            self.position += len(taken)
            view = view[len(taken) :]

    def finish(self) -> None:
        """Raises InvalidArgument unless the whole section was checked."""
        if self.position != self.end:
            raise InvalidArgument(
                f"{self._file_name}: data section ends after {self.position} of its "
                f"{self.end} bytes"
            )

    def _check(self, tensor: TensorInfo, piece: memoryview) -> None:
        layout = _LAYOUTS.get(tensor.dtype)
        if layout is None:
            return
        # The element of the tensor that `data` starts at.
        first = (self.position - len(self._carry) - tensor.begin) // layout.size
        data = self._carry + piece.tobytes()
        whole = len(data) - len(data) % layout.size
        self._carry = data[whole:]
        found = _first_non_finite(data[:whole] if self._carry else data, tensor.dtype)
        if found is None:
            return
        value = int.from_bytes(data[found * layout.size : (found + 1) * layout.size], "little")
        kind = "NaN" if value & ((1 << layout.mantissa_bits) - 1) else "an infinity"
        raise InvalidArgument(
            f"{self._file_name}: tensor {tensor.name!r} holds {kind} at element "
            f"{first + found} (shape {list(tensor.shape)}); LoRA weights must be finite"
        )


def _first_non_finite(data: bytes, dtype: str) -> int | None:
    """The index of the first NaN or infinite value in `data` (whole values), or None.

    Bytes operations only, each a C loop (the store does not load numpy): the most
    significant byte of every value, strided out and translated to 1 where it holds
    its part of the exponent; then, only if any does, the same for the byte below,
    and the two combined as one big integer's AND."""
    layout = _LAYOUTS[dtype]
    top_marks, second_marks = _MARKS[dtype]
    tops = data[layout.size - 1 :: layout.size].translate(top_marks)
    candidate = tops.find(1)
    if candidate < 0 or not layout.second:
        return None if candidate < 0 else candidate
    seconds = data[layout.size - 2 :: layout.size].translate(second_marks)
    both = int.from_bytes(tops, "little") & int.from_bytes(seconds, "little")
    # Each value's mark is one byte, 0 or 1: the lowest set bit is at 8 x its index.
    return ((both & -both).bit_length() - 1) // 8 if both else None


class WeightsFileCheck:
    """A whole safetensors file, fed in order from its first byte: parses the header
    once it has arrived (InvalidArgument as `parse_safetensors_header`), then checks
    every value as `DataSectionCheck` does."""

    def __init__(self, file_size: int, file_name: str = WEIGHTS_FILE) -> None:
        self._file_size = file_size
        self._file_name = file_name
        self._header = bytearray()
        self._header_end = 8  # known once the first 8 bytes are in
        self.tensors: list[TensorInfo] | None = None
        self._data: DataSectionCheck | None = None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while self._data is None and view:
            taken = view[: self._header_end - len(self._header)]
            self._header += taken
            view = view[len(taken) :]
            self._parse_when_complete()
        if self._data is not None and view:
            self._data.update(view)

    def cost(self, size: int) -> int:
        """Bytes an `update` with `size` more bytes would check or parse: `size`, plus the
        header's length when they complete a header whose length is known."""
        if self._data is None and len(self._header) + size >= self._header_end > 8:
            return size + self._header_end
        return size

    def finish(self) -> None:
        """Raises InvalidArgument unless the whole file was seen and checked."""
        if self._data is None:
            # Too short to hold its own header: name the problem the header check names.
            safetensors_header_length(bytes(self._header), self._file_size, self._file_name)
            raise InvalidArgument(f"{self._file_name}: the file ends inside its header")
        self._data.finish()

    def _parse_when_complete(self) -> None:
        if len(self._header) != self._header_end:
            return
        if self._header_end == 8:
            length = safetensors_header_length(
                bytes(self._header), self._file_size, self._file_name
            )
            self._header_end = 8 + length
            return
        self.tensors = parse_safetensors_header(bytes(self._header[8:]), self._file_size)
        self._data = DataSectionCheck(self.tensors, self._file_name)


def check_weights_file(path: Path, chunk_size: int = 1024 * 1024) -> None:
    """`WeightsFileCheck` of a file on disk, read in chunks. Blocking: reads the file."""
    check = WeightsFileCheck(path.stat().st_size, path.name)
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            check.update(chunk)
    check.finish()
