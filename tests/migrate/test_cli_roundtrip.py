"""Property tests: whatever the line endings, BOM and final newline, a file round-trips exactly."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from migrate.cli import app
from migrate.files import read_source, write_atomic

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PLAIN = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.in.py").read_text()
MIGRATED = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.out.py").read_text()


def variant(text: str, newline: str, bom: bool, final_newline: bool) -> bytes:
    if not final_newline:
        text = text.rstrip("\n")
    return (b"\xef\xbb\xbf" if bom else b"") + text.replace("\n", newline).encode()


@settings(max_examples=12, deadline=None)
@given(newline=st.sampled_from(["\n", "\r\n"]), bom=st.booleans(), final_newline=st.booleans())
def test_migrated_file_keeps_crlf_bom_and_final_newline(newline: str, bom: bool, final_newline: bool) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "train.py"
        path.write_bytes(variant(PLAIN, newline, bom, final_newline))
        result = CliRunner().invoke(app, ["-j", "1", str(path)])
        assert result.exit_code == 0, result.output
        assert path.read_bytes() == variant(MIGRATED, newline, bom, final_newline)


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=200),
    st.booleans(),
)
def test_read_then_write_is_byte_exact(text: str, bom: bool) -> None:
    """Decoding without newline translation and re-encoding gives back the same bytes (\\r, \\r\\n, ...)."""
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.py"
        path.write_bytes(data)
        path.chmod(0o640)
        source = read_source(path)
        write_atomic(source, source.text)
        assert path.read_bytes() == data
        assert path.stat().st_mode & 0o777 == 0o640
        assert [p.name for p in Path(directory).iterdir()] == ["x.py"]  # no temp file left behind


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet="abcdef =()\n\r\t#:'", max_size=120))
def test_files_without_torch_are_never_written(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.py"
        path.write_bytes(text.encode())
        before = path.stat().st_mtime_ns
        result = CliRunner().invoke(app, ["-j", "1", "--output-format", "json", str(path)])
        assert result.exit_code == 0
        assert path.read_bytes() == text.encode() and path.stat().st_mtime_ns == before
        assert '"status": "skipped"' in result.stdout
