"""Saves are all or nothing: a failure inside the writer leaves the previous folder byte-identical (and no staging
folder behind); the command line refuses outputs that would destroy its source, with one error line."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers.modeling_utils
from helpers import tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, saving
from hf_tensorcompress.cli import main
from hf_tensorcompress.runtime import atomic
from hf_tensorcompress.runtime.atomic import atomic_folder


def cli_error(capsys, *args: str) -> str:
    """The one stderr line of a refused command (exit code 2, in process: the refusals come before any loading)."""
    assert main(list(args)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf-tensorcompress compress: error: "), lines
    return lines[0]


def compressed(method: str = "svd") -> PatchTSTForPrediction:
    torch.manual_seed(0)
    options = {"cp_iterations": 1} if method == "cp" else {}
    config = CompressionConfig(method=method, rank=2, **options)
    return apply_compression(PatchTSTForPrediction(tiny_patchtst_config()).eval(), config)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes, and the names beside it (a left-over staging folder shows)."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    return {**files, "<siblings>": repr(sorted(p.name for p in folder.parent.iterdir())).encode()}


class Killed(Exception):
    """Stands for the process dying mid-write."""


def half_write(tensors, filename, *args, **kwargs) -> None:
    Path(filename).write_bytes(b"half a file")
    raise Killed("killed while writing the weights")


@pytest.fixture
def previous(tmp_path) -> Path:
    """A folder holding an earlier save and a file the user put there (e.g. a tokenizer)."""
    folder = tmp_path / "model"
    compressed("cp").save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_killed_while_writing_the_weights_leaves_the_old_folder_byte_identical(previous, monkeypatch):
    before = snapshot(previous)
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", half_write)
    with pytest.raises(Killed):
        compressed("svd").save_pretrained(previous)
    assert snapshot(previous) == before


def test_killed_while_writing_the_code_or_card_leaves_the_old_folder_byte_identical(previous, monkeypatch):
    before = snapshot(previous)

    def dies(folder, methods, optional=()):
        raise Killed("killed while writing the modeling code")

    monkeypatch.setattr(saving, "write_modeling_code", dies)
    with pytest.raises(Killed):
        compressed("svd").save_pretrained(previous)
    assert snapshot(previous) == before


def test_a_save_that_succeeds_replaces_the_model_and_keeps_the_other_files(previous):
    compressed("svd").save_pretrained(previous)
    assert '"method": "svd"' in (previous / "config.json").read_text()
    assert (previous / "tokenizer.json").read_text() == "{}"
    assert sorted(p.name for p in previous.parent.iterdir()) == ["model"]


def test_a_first_save_creates_the_folder_with_the_usual_permissions(tmp_path):
    reference = tmp_path / "plain"
    reference.mkdir()
    compressed().save_pretrained(tmp_path / "new")
    assert (tmp_path / "new" / "config.json").is_file()
    assert (tmp_path / "new").stat().st_mode == reference.stat().st_mode


def test_saving_onto_a_file_is_refused_and_the_file_kept(tmp_path):
    target = tmp_path / "model"
    target.write_text("not a folder")
    with pytest.raises(NotADirectoryError, match="is a file"):
        compressed().save_pretrained(target)
    assert target.read_text() == "not a folder"


def test_atomic_folder_leaves_nothing_behind_on_error(tmp_path):
    with pytest.raises(Killed):
        with atomic_folder(tmp_path / "out") as staging:
            (staging / "a").write_text("a")
            raise Killed
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("source") / "dense"
    torch.manual_seed(0)
    PatchTSTForPrediction(tiny_patchtst_config()).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("where", ["itself", "inside", "holding"])
def test_the_cli_refuses_to_write_over_its_source(dense, where, capsys):
    before = snapshot(dense)
    output = {"itself": dense, "inside": dense / "compressed", "holding": dense.parent}[where]
    line = cli_error(capsys, "compress", str(dense), str(output), "--method", "svd", "--overwrite")
    assert "is the source" in line and "outside the source" in line
    assert snapshot(dense) == before


def test_the_cli_refuses_an_output_that_is_a_file(dense, tmp_path, capsys):
    output = tmp_path / "model.bin"
    output.write_text("keep me")
    line = cli_error(capsys, "compress", str(dense), str(output), "--method", "svd")
    assert "is a file" in line and "folder path" in line
    assert output.read_text() == "keep me"


def test_the_cli_writes_model_and_tokenizer_together(dense, tmp_path, monkeypatch):
    """A failure after the model is written (here: the tokenizer) leaves the earlier output as it was."""
    output = tmp_path / "out"
    output.mkdir()
    (output / "earlier.txt").write_text("earlier run")
    before = snapshot(output)

    def dies(source, folder):
        assert (Path(folder) / "model.safetensors").is_file()
        raise Killed("killed while copying the tokenizer")

    monkeypatch.setattr("hf_tensorcompress.cli.compress.save_beside", dies)
    with pytest.raises(Killed):
        main(["compress", str(dense), str(output), "--method", "svd", "--rank", "2", "--overwrite"])
    assert snapshot(output) == before


def kill_saves(tmp_path: Path, kills: int) -> list[dict]:
    """Run tests/kill_saves.py (its own process: it forks and SIGKILLs savers) over the three ways a save lands."""
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    modes = "exchange,renames,in-place"
    run = subprocess.run(
        [sys.executable, str(tests / "kill_saves.py"), str(tmp_path), modes, str(kills), "0"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert [result["loaded_old_or_new"] for result in results] == [kills] * 3, results
    return results


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_twenty_one_killed_saves_leave_the_old_or_the_new_checkpoint(tmp_path):
    kill_saves(tmp_path, 7)


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_save_killed_between_its_renames_is_recovered_by_the_next_load_and_cleaned_by_the_next_save(previous):
    expected = output_of(previous)
    pid = dead_pid()
    previous.rename(previous.parent / f".model.{pid}.0a0a0a0a.old")  # the old folder renamed aside, then killed
    (previous.parent / f".model.{pid}.0b0b0b0b.partial").mkdir()  # the new one, never moved in
    torch.testing.assert_close(output_of(previous), expected)
    assert (previous / "tokenizer.json").is_file()
    (previous.parent / f".model.{pid}.0c0c0c0c.partial").mkdir()
    compressed("svd").save_pretrained(previous)
    assert sorted(p.name for p in previous.parent.iterdir()) == ["model"]


def test_a_live_saves_staging_folder_is_left_alone(previous):
    live = previous.parent / f".model.{os.getppid()}.0a0a0a0a.partial"
    live.mkdir()
    compressed("svd").save_pretrained(previous)
    assert live.is_dir()


def test_an_in_place_save_killed_while_moving_files_in_is_finished_by_the_next_load(previous, monkeypatch):
    monkeypatch.setattr(atomic, "_unmovable", lambda target: True)
    monkeypatch.setattr(atomic, "_move_in", lambda ready, target: None)  # killed right after staging
    compressed("svd").save_pretrained(previous)
    monkeypatch.undo()
    (ready,) = [p for p in previous.iterdir() if p.name.startswith(atomic.IN_PLACE)]
    pid = dead_pid()
    ready = ready.rename(previous / f"{atomic.IN_PLACE}.{pid}.0a0a0a0a.{atomic.READY}")
    (previous / "config.json").unlink()  # killed after the old config went out
    torch.testing.assert_close(output_of(previous), output_of_model(compressed("svd")))
    assert not ready.exists()


def output_of_model(model: PatchTSTForPrediction) -> torch.Tensor:
    torch.manual_seed(1)
    inputs = torch.randn(1, model.config.context_length, model.config.num_input_channels)
    with torch.no_grad():
        return model(past_values=inputs).prediction_outputs


def output_of(folder: Path) -> torch.Tensor:
    return output_of_model(type(compressed()).from_pretrained(str(folder)).eval())


def test_a_resave_links_the_files_it_keeps_instead_of_copying_them(previous):
    kept = (previous / "tokenizer.json").stat().st_ino
    compressed("svd").save_pretrained(previous)
    assert (previous / "tokenizer.json").stat().st_ino == kept


def test_saving_into_the_working_directory(previous, monkeypatch):
    folder = previous.stat().st_ino
    monkeypatch.chdir(previous)
    compressed("svd").save_pretrained(".")
    assert previous.stat().st_ino == folder and '"method": "svd"' in (previous / "config.json").read_text()
    assert (previous / "tokenizer.json").is_file()
    assert sorted(p.name for p in previous.parent.iterdir()) == ["model"]
    assert not [p for p in previous.iterdir() if p.name.startswith(atomic.IN_PLACE)]
    torch.testing.assert_close(output_of(previous), output_of_model(compressed("svd")))


def test_saving_into_a_mount_point_writes_inside_it(previous, monkeypatch):
    """A mount point cannot be renamed (EBUSY): the files are renamed in one by one instead."""
    folder = previous.stat().st_ino
    monkeypatch.setattr(atomic.os.path, "ismount", lambda path: Path(path) == previous)
    monkeypatch.setattr(atomic, "_exchange", lambda first, second: pytest.fail("the mount point was renamed"))
    compressed("svd").save_pretrained(previous)
    assert previous.stat().st_ino == folder and (previous / "tokenizer.json").is_file()
    torch.testing.assert_close(output_of(previous), output_of_model(compressed("svd")))


def test_a_symlinked_target_is_written_through_and_stays_a_link(previous):
    link = previous.parent / "link"
    link.symlink_to(previous, target_is_directory=True)
    compressed("svd").save_pretrained(link)
    assert link.is_symlink() and '"method": "svd"' in (previous / "config.json").read_text()
    assert sorted(p.name for p in previous.parent.iterdir()) == ["link", "model"]


def test_the_cli_reports_a_full_disk_in_one_line(dense, tmp_path, monkeypatch, capsys):
    def full(tensors, filename, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    output = tmp_path / "out"
    assert main(["compress", str(dense), str(output), "--method", "svd", "--rank", "2"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("hf-tensorcompress compress: error: ") and "No space left" in lines[-1], lines
    assert not any("Traceback" in line for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("in_place", [False, True])
def test_old_weight_files_do_not_outlive_a_new_save(previous, monkeypatch, in_place):
    """An old shard or index beside the new ``model.safetensors`` could be loaded instead of it; other files stay."""
    for name in ["model-00001-of-00002.safetensors", "model.safetensors.index.json"]:
        (previous / name).write_text("old")
    if in_place:
        monkeypatch.chdir(previous)
    compressed("svd").save_pretrained("." if in_place else previous)
    names = {p.name for p in previous.iterdir()}
    assert {"model.safetensors", "tokenizer.json"} <= names
    assert not {"model-00001-of-00002.safetensors", "model.safetensors.index.json"} & names


#: A save that another PID namespace (another container on a shared volume) runs: its staging names carry a process
#: id that means nothing here. It writes, waits for the test to load and save the same folder, then finishes.
OTHER_NAMESPACE_WRITER = """
import os, sys
from hf_tensorcompress.runtime import atomic
os.getpid = lambda: {pid}  # the process id it records: no process here has it
with atomic.atomic_folder(sys.argv[1]) as staging:
    (staging / "config.json").write_text('{{"writer": "other namespace"}}')
    print("staging", flush=True)
    sys.stdin.readline()
    (staging / "weights.bin").write_bytes(b"written after the other save")
print("saved", flush=True)
"""


def test_a_save_of_another_pid_namespace_survives_the_loads_and_saves_made_here(tmp_path):
    """The writer's lock, not its process id, says it is alive: a load here (``recover``) and a save here leave its
    staging folder, and it finishes; nothing is left behind."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text('{"writer": "first"}')
    writer = subprocess.Popen(
        [sys.executable, "-c", OTHER_NAMESPACE_WRITER.format(pid=dead_pid()), str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "staging", writer.stderr.read()
        atomic.recover(target)  # what every load of the folder runs first
        with atomic_folder(target) as staging:  # and a save here meanwhile
            (staging / "config.json").write_text('{"writer": "here"}')
        assert json.loads((target / "config.json").read_text()) == {"writer": "here"}
        writer.stdin.write("\n")
        writer.stdin.flush()
        out, err = writer.communicate(timeout=60)
    finally:
        writer.kill()
    assert writer.returncode == 0 and out.strip() == "saved", err[-2000:]
    assert json.loads((target / "config.json").read_text()) == {"writer": "other namespace"}
    assert (target / "weights.bin").read_bytes() == b"written after the other save"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no staging folder, no lock left


def test_a_killed_writers_lock_and_folders_are_removed_by_the_next_save(tmp_path):
    """A lock file nobody holds (its writer was killed) is the writer gone, whatever its process id says."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")
    token = f"{os.getpid()}.0a0a0a0a"  # a live process id: only the lock tells
    (tmp_path / f".model.{token}.partial").mkdir()
    (tmp_path / f".model.{token}.lock").touch()
    with atomic_folder(target) as staging:
        (staging / "config.json").write_text('{"saved": true}')
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("in_place", [False, True], ids=["beside", "in-place"])
def test_a_writer_killed_before_locking_its_lock_file_leaves_nothing_after_the_next_save(
    tmp_path, monkeypatch, in_place
):
    """A writer killed between creating its lock file and locking it leaves ``<prefix>.<token>.locking``: nobody
    holds it, so the next save removes it (it was residue every later save kept)."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")
    if in_place:
        monkeypatch.chdir(target)  # the working directory cannot be renamed: the save stages inside it
    prefix = target / atomic.IN_PLACE if in_place else tmp_path / ".model"
    Path(f"{prefix}.{os.getpid()}.0a0a0a0a.{atomic.LOCKING}").touch()  # a live process id: only the lock tells
    Path(f"{prefix}.{dead_pid()}.0b0b0b0b.{atomic.LOCKING}").touch()
    with atomic_folder(target) as staging:
        (staging / "config.json").write_text('{"saved": true}')
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]
    assert sorted(path.name for path in target.iterdir()) == ["config.json"]


def test_a_live_writers_lock_file_is_left_alone_while_it_is_still_being_locked(tmp_path):
    """A ``.locking`` file whose writer holds its lock (the moment before the rename to ``.lock``) is left alone."""
    target = tmp_path / "model"
    target.mkdir()
    locking = tmp_path / f".model.{dead_pid()}.0a0a0a0a.{atomic.LOCKING}"  # another namespace's: its pid means nothing
    descriptor = os.open(locking, os.O_CREAT | os.O_WRONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        with atomic_folder(target) as staging:
            (staging / "config.json").write_text("{}")
        assert locking.is_file()
    finally:
        os.close(descriptor)


def test_a_writer_whose_unlocked_lock_file_was_taken_starts_again(tmp_path, monkeypatch):
    """Between creating its lock file and locking it, a writer's file looks like a killed writer's, and another
    process's ``recover`` may remove it: the writer then starts again under a new name, and saves."""
    target = tmp_path / "model"
    locked = []

    def flock_after_a_recover(descriptor: int, operation: int) -> None:
        locked.append(operation)
        if locked == [fcntl.LOCK_EX]:  # the writer's first lock only: as if another process's recover ran just before
            atomic.recover(target)
        real_flock(descriptor, operation)

    real_flock = fcntl.flock
    monkeypatch.setattr(atomic.fcntl, "flock", flock_after_a_recover)
    with atomic_folder(target) as staging:
        (staging / "config.json").write_text('{"saved": true}')
    assert locked.count(fcntl.LOCK_EX) == 2  # the first lock file was taken by recover, the second kept
    assert json.loads((target / "config.json").read_text()) == {"saved": True}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]
