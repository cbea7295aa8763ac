"""The reference packages are read as pinned, or a profile that needs one does not start."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from app.config import Settings
from app.writers import references
from app.writers.profiles import PROFILE_REFERENCES, get_profile
from app.writers.registry import WriterRegistry


def test_a_profile_whose_reference_is_missing_refuses_to_start_naming_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSTORE_REFERENCES_DIR", str(tmp_path))
    for profile, reference in PROFILE_REFERENCES.items():
        with pytest.raises(references.ReferencePackageError, match="memstore references install") as refused:
            get_profile(profile)
        assert reference.label in str(refused.value)
    assert get_profile("simple").prompts.texts  # Memstore's own protocol needs none
    with pytest.raises(ValueError, match=r"hy-memory 2\.0\.6 is not installed"):
        WriterRegistry(Settings(writer="openai", writer_profile="hy-memory"))


def test_an_altered_reference_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = references.folder(references.MEMOS)
    copy = tmp_path / installed.name
    shutil.copytree(installed, copy)
    prompts = copy / references.MEMOS_PROMPTS
    prompts.write_text(
        prompts.read_text(encoding="utf-8").replace("Conversation:", "Chat:"), encoding="utf-8"
    )
    monkeypatch.setenv("MEMSTORE_REFERENCES_DIR", str(tmp_path))
    with pytest.raises(references.ReferencePackageError, match=r"is not the file of MemoryOS 2\.0\.33"):
        get_profile("memos")


def test_constants_are_read_without_running_the_file(tmp_path: Path) -> None:
    reference = references.Reference("made-up", "1.0", "0" * 64, {"m.py": ""})
    text = 'import sys\nsys.exit("ran")\nA = "one"\nB = A + " two"\nC: str = "three"\nD = f"{A}"\n'
    (tmp_path / "made-up-1.0").mkdir()
    (tmp_path / "made-up-1.0" / "m.py").write_text(text)
    pinned = references.Reference(
        "made-up", "1.0", "0" * 64, {"m.py": hashlib.sha256(text.encode()).hexdigest()}
    )
    assert references.constants(pinned, "m.py", "A", "B", "C", root=tmp_path) == {
        "A": "one",
        "B": "one two",
        "C": "three",
    }
    with pytest.raises(references.ReferencePackageError, match="no string constant D"):
        references.constants(pinned, "m.py", "D", root=tmp_path)  # an f-string is not a constant
    assert references.fstring(pinned, "m.py", "D", root=tmp_path).render({"A": "x"}) == "x"
    with pytest.raises(references.ReferencePackageError, match="not the file"):
        references.constants(reference, "m.py", "A", root=tmp_path)


def test_every_pinned_reference_is_installed_and_intact() -> None:
    references.check(references.REFERENCES.values())
