"""The emulator answers ``huggingface_hub``'s own client the way the Hub does (what the push tests rely on)."""

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError


def test_upload_list_download_round_trip(hub, repo_id, tmp_path):
    api = HfApi()
    assert api.whoami()["name"] == hub.USER
    url = api.create_repo(repo_id)
    assert url.repo_id == repo_id
    api.create_repo(repo_id, exist_ok=True)  # 409 is swallowed by exist_ok, as on the Hub
    weights = bytes(range(256)) * 40  # binary -> git-lfs batch upload
    (tmp_path / "weights.safetensors").write_bytes(weights)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("plain text")
    api.upload_folder(folder_path=tmp_path, repo_id=repo_id)
    assert ("POST", f"/{repo_id}.git/info/lfs/objects/batch") in hub.state.requests

    tree = {entry.path: entry for entry in api.list_repo_tree(repo_id, recursive=True)}
    assert {"weights.safetensors", "sub", "sub/notes.txt", ".gitattributes"} <= set(tree)
    assert tree["weights.safetensors"].lfs.size == len(weights)
    info = api.model_info(repo_id)
    assert {s.rfilename for s in info.siblings} == {".gitattributes", "weights.safetensors", "sub/notes.txt"}

    assert open(hf_hub_download(repo_id, "weights.safetensors"), "rb").read() == weights
    assert open(hf_hub_download(repo_id, "sub/notes.txt")).read() == "plain text"
    # re-uploading unchanged files makes no new commit
    api.upload_folder(folder_path=tmp_path, repo_id=repo_id)
    assert api.model_info(repo_id).sha == info.sha


def test_errors_carry_the_hub_error_codes(hub, repo_id):
    api = HfApi()
    api.create_repo(repo_id)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo_id, "missing.json")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(f"{hub.USER}/no-such-repo")
    with pytest.raises(HfHubHTTPError) as bad_token:
        HfApi(token="hf_not_a_real_token").whoami()
    assert bad_token.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as foreign:
        api.create_repo("someone-else/model")
    assert foreign.value.response.status_code == 403
