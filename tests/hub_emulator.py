"""A small in-memory emulator of the Hugging Face Hub HTTP API, for tests (not shipped).

It answers the requests ``huggingface_hub`` really sends for ``create_repo``, ``whoami``, README validation,
``preupload``, ``commit`` (regular files inline, large/binary files through the git-lfs batch API when
``HF_HUB_DISABLE_XET=1``), tree listing, ``repo_info``/``model_info`` and ``resolve`` (HEAD and GET), with the
headers and error codes the client relies on: ``ETag``/``X-Repo-Commit``/``Content-Length`` on regular files, a
302 to a separate storage origin with ``X-Linked-Etag``/``X-Linked-Size`` on LFS files, ``404`` +
``X-Error-Code: EntryNotFound`` / ``RepoNotFound`` / ``RevisionNotFound``, ``401`` for unknown tokens and
``403`` for writes outside the token owner's namespace. LFS objects live on a second server (another port on
127.0.0.1, standing in for the CDN/S3), so the client's cross-origin logic runs as it does against the Hub.
Model repos only.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

#: Patterns the Hub's default ``.gitattributes`` sends to LFS (a subset: what model repos hold).
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.onnx", "*.msgpack", "*.zip")
GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS).encode()
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class StoredFile:
    """A file at one commit: inline content (regular) or a pointer to an LFS object (``sha256``)."""

    size: int
    content: bytes | None = None
    sha256: str | None = None

    @property
    def oid(self) -> str:
        """What the Hub reports as the file's ``oid``/ETag: git blob sha1 (regular) or sha256 (LFS)."""
        return self.sha256 if self.sha256 else git_blob_sha1(self.content)


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, dict[str, StoredFile]] = field(default_factory=dict)  # sha -> snapshot
    main: str = ""

    def snapshot(self, revision: str) -> tuple[str, dict[str, StoredFile]] | None:
        sha = self.main if revision == "main" else revision
        return (sha, self.commits[sha]) if sha in self.commits else None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **body):
        super().__init__(message)
        self.status, self.message, self.code, self.headers, self.body = status, message, code, headers or {}, body


class HubState:
    """Everything the emulated Hub knows: users and their tokens, repos, LFS objects, and a request log."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens  # token -> user name
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def create_repo(self, repo_id: str, private: bool) -> Repo:
        repo = Repo(repo_id, private)
        self.commit(repo, {".gitattributes": StoredFile(len(GITATTRIBUTES), content=GITATTRIBUTES)}, deleted=())
        self.repos[repo_id] = repo
        return repo

    @staticmethod
    def commit(repo: Repo, added: dict[str, StoredFile], deleted) -> str:
        files = dict(repo.commits.get(repo.main, {}))
        for path in deleted:
            files = {p: f for p, f in files.items() if p != path and not p.startswith(path.rstrip("/") + "/")}
        files.update(added)
        sha = hashlib.sha1(uuid.uuid4().bytes).hexdigest()
        repo.commits[sha] = files
        repo.main = sha
        return sha


#: A subset of the Hub's pipeline tags and license ids (what the Hub's metadata validation accepts).
PIPELINE_TAGS = {
    "text-generation",
    "time-series-forecasting",
    "feature-extraction",
    "text-classification",
    "token-classification",
    "fill-mask",
    "tabular-classification",
    "tabular-regression",
}
LICENSES = {"apache-2.0", "mit", "bsd-3-clause", "cc-by-4.0", "cc-by-sa-4.0", "llama3", "openrail", "other"}
REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def card_metadata_errors(metadata: dict) -> list[str]:
    """The Hub's model-card metadata rules for the fields model cards here use."""
    errors = []
    for key in ("tags", "datasets", "metrics"):
        value = metadata.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            errors.append(f'"{key}" must be a list of strings')
    if "library_name" in metadata and not isinstance(metadata["library_name"], str):
        errors.append('"library_name" must be a string')
    if "pipeline_tag" in metadata and metadata["pipeline_tag"] not in PIPELINE_TAGS:
        errors.append(f'"pipeline_tag" must be a valid pipeline tag, got {metadata["pipeline_tag"]!r}')
    if "license" in metadata and metadata["license"] not in LICENSES:
        errors.append(f'"license" must be a license identifier, got {metadata["license"]!r}')
    base = metadata.get("base_model")
    for value in base if isinstance(base, list) else [] if base is None else [base]:
        if not isinstance(value, str) or not REPO_ID.match(value):
            errors.append(f'"base_model" must be a model id, got {value!r}')
    return errors


ROUTES: list[tuple[str, re.Pattern, str]] = [
    (method, re.compile(pattern), handler)
    for method, pattern, handler in (
        ("POST", r"/api/repos/create", "create_repo"),
        ("GET", r"/api/whoami-v2", "whoami"),
        ("GET", r"/api/agent-harnesses", "agent_harnesses"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
        ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)", "preupload"),
        ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)", "commit"),
        ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree"),
        ("POST", r"/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch", "lfs_batch"),
        ("PUT", r"/lfs-storage/(?P<oid>[0-9a-f]{64})", "lfs_put"),
        ("GET|HEAD", r"/lfs-storage/(?P<oid>[0-9a-f]{64})", "lfs_get"),
        ("GET|HEAD", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    )
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects; every response sets Content-Length
    server: EmulatorServer

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    # ---------------------------------------------------------------- plumbing
    def do_GET(self) -> None:
        self.dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def dispatch(self) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.body = self.read_body()
        state = self.server.state
        state.requests.append((self.command, url.path))
        try:
            for methods, pattern, name in ROUTES:
                match = pattern.fullmatch(unquote(url.path))
                if match and self.command in methods.split("|"):
                    with state.lock:
                        return getattr(self, name)(**{k: v for k, v in match.groupdict().items()})
            raise HubError(404, f"Sorry, we can't find the page you are looking for: {self.command} {url.path}")
        except HubError as error:
            headers = {"X-Error-Message": error.message, **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self.send(error.status, {"error": error.message, **error.body}, headers)

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send(self, status: int, payload=None, headers: dict | None = None, raw: bytes | None = None) -> None:
        body = raw if raw is not None else b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def json(self) -> dict:
        return json.loads(self.body or b"{}")

    @property
    def hub_url(self) -> str:
        return self.server.hub_url

    # ---------------------------------------------------------------- auth and lookup
    def user(self, required: bool) -> str | None:
        """The token's owner; 401 for an unknown token, or when ``required`` and no token was sent."""
        header = self.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            if required:
                raise HubError(401, "Invalid username or password.")
            return None
        token = header[len("Bearer ") :]
        if token not in self.server.state.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.server.state.tokens[token]

    def repo(self, repo_id: str, write: bool = False) -> Repo:
        user = self.user(required=write)
        repo = self.server.state.repos.get(repo_id)
        if repo is None or (repo.private and user != repo_id.split("/")[0]):
            raise HubError(404, "Repository not found", "RepoNotFound")
        if write and user != repo_id.split("/")[0]:
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    def snapshot(self, repo: Repo, revision: str) -> tuple[str, dict[str, StoredFile]]:
        found = repo.snapshot(unquote(revision))
        if found is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return found

    # ---------------------------------------------------------------- endpoints
    def create_repo(self) -> None:
        user = self.user(required=True)
        payload = self.json()
        if payload.get("type", "model") != "model":
            raise HubError(400, "This emulator hosts model repositories only")
        namespace = payload.get("organization") or user
        repo_id = f"{namespace}/{payload['name']}"
        if namespace != user:
            raise HubError(403, f'You don\'t have the rights to create a model under the namespace "{namespace}"')
        url = f"{self.hub_url}/{repo_id}"
        if repo_id in self.server.state.repos:
            raise HubError(409, "You already created this model repo", url=url)
        self.server.state.create_repo(repo_id, payload.get("visibility") == "private" or bool(payload.get("private")))
        self.send(200, {"url": url, "name": repo_id, "id": repo_id})

    def whoami(self) -> None:
        user = self.user(required=True)
        access = {"displayName": "emulator", "role": "write"}
        self.send(200, {"type": "user", "name": user, "fullname": user, "orgs": [], "auth": {"accessToken": access}})

    def agent_harnesses(self) -> None:
        self.send(200, {"standardEnvVars": [], "harnesses": {}})

    def validate_yaml(self) -> None:
        content = self.json().get("content", "")
        match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.DOTALL)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as error:
            self.send(400, {"errors": [{"message": f"Invalid YAML: {error}"}]})
            return
        errors = (
            card_metadata_errors(metadata)
            if isinstance(metadata, dict)
            else ([] if metadata is None else ["Metadata must be a YAML mapping"])
        )
        if errors:
            self.send(400, {"errors": [{"message": message} for message in errors]})
            return
        self.send(200, {"errors": [], "warnings": [] if metadata else [{"message": "Empty metadata"}]})

    def repo_info(self, repo: str, rev: str | None) -> None:
        found = self.repo(repo)
        sha, files = self.snapshot(found, rev or "main")
        siblings = [{"rfilename": path} for path in sorted(files)]
        self.send(
            200,
            {
                "id": repo,
                "modelId": repo,
                "sha": sha,
                "private": found.private,
                "siblings": siblings,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "lastModified": "2026-01-01T00:00:00.000Z",
            },
        )

    def preupload(self, repo: str, rev: str) -> None:
        _, files = self.snapshot(self.repo(repo, write=True), rev)
        answers = []
        for entry in self.json()["files"]:
            sample = base64.b64decode(entry["sample"])
            lfs = (
                any(fnmatch.fnmatch(entry["path"].rsplit("/", 1)[-1], p) for p in LFS_PATTERNS)
                or entry["size"] >= LFS_SIZE_THRESHOLD
                or b"\0" in sample
            )
            existing = files.get(entry["path"])
            answers.append(
                {
                    "path": entry["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": existing.oid if existing else None,
                }
            )
        self.send(200, {"files": answers})

    def lfs_batch(self, repo: str) -> None:
        self.repo(repo, write=True)
        payload = self.json()
        objects = []
        for obj in payload["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.server.state.lfs:
                href = f"{self.server.storage_url}/lfs-storage/{obj['oid']}"
                answer["actions"] = {"upload": {"href": href, "expires_at": "2099-01-01T00:00:00Z"}}
            objects.append(answer)
        self.send(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def lfs_put(self, oid: str) -> None:
        if hashlib.sha256(self.body).hexdigest() != oid:
            raise HubError(400, "Uploaded content does not match its sha256")
        self.server.state.lfs[oid] = self.body
        self.send(200, raw=b"", headers={"ETag": f'"{oid[:32]}"'})

    def lfs_get(self, oid: str) -> None:
        if oid not in self.server.state.lfs:
            raise HubError(404, "No such object")
        self.send_content(self.server.state.lfs[oid], {"ETag": f'"{oid}"'})

    def send_content(self, content: bytes, headers: dict) -> None:
        """Bytes with ``Range: bytes=N-`` support (the client resumes interrupted downloads that way)."""
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            headers = {**headers, "Content-Range": f"bytes {start}-{len(content) - 1}/{len(content)}"}
            self.send(206, raw=content[start:], headers=headers)
        else:
            self.send(200, raw=content, headers=headers)

    def commit(self, repo: str, rev: str) -> None:
        found = self.repo(repo, write=True)
        if unquote(rev) != "main":
            raise HubError(400, "This emulator commits to the main branch only")
        added, deleted, summary = {}, [], None
        for line in self.body.splitlines():
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "header":
                summary = value.get("summary")
            elif item["key"] == "file":
                content = base64.b64decode(value["content"])
                added[value["path"]] = StoredFile(len(content), content=content)
            elif item["key"] == "lfsFile":
                if value["oid"] not in self.server.state.lfs:
                    raise HubError(422, f"LFS object {value['oid']} for {value['path']} was never uploaded")
                added[value["path"]] = StoredFile(len(self.server.state.lfs[value["oid"]]), sha256=value["oid"])
            elif item["key"] in ("deletedFile", "deletedFolder"):
                deleted.append(value["path"])
        if not summary:
            raise HubError(400, "Commit summary is required")
        sha = self.server.state.commit(found, added, deleted)
        self.send(
            200,
            {
                "commitUrl": f"{self.hub_url}/{repo}/commit/{sha}",
                "commitOid": sha,
                "success": True,
                "pullRequestUrl": None,
            },
        )

    def tree(self, repo: str, rev: str, path: str | None) -> None:
        _, files = self.snapshot(self.repo(repo), rev)
        prefix = (path or "").strip("/")
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        entries, folders = [], set()
        for name in sorted(files):
            if prefix and not name.startswith(prefix + "/"):
                continue
            rest = name[len(prefix) + 1 :] if prefix else name
            parts = rest.split("/")
            for depth in range(1, len(parts) if recursive else min(2, len(parts))):
                folders.add("/".join(([prefix] if prefix else []) + parts[:depth]))
            if recursive or len(parts) == 1:
                stored = files[name]
                entry = {"type": "file", "path": name, "size": stored.size, "oid": git_blob_sha1(stored.content or b"")}
                if stored.sha256:
                    entry["lfs"] = {"oid": stored.sha256, "size": stored.size, "pointerSize": 134}
                entries.append(entry)
        if prefix and not entries and not folders:
            raise HubError(404, f"{prefix} does not exist on main", "EntryNotFound")
        folder_entries = [{"type": "directory", "path": f, "oid": git_blob_sha1(f.encode())} for f in sorted(folders)]
        self.send(200, folder_entries + entries)

    def resolve(self, repo: str, rev: str, path: str) -> None:
        sha, files = self.snapshot(self.repo(repo), rev)
        stored = files.get(path)
        if stored is None:
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{stored.oid}"', "Accept-Ranges": "bytes"}
        if stored.sha256:  # LFS: redirect to the storage origin, metadata in X-Linked-* headers
            headers.update(
                {
                    "X-Linked-Etag": f'"{stored.sha256}"',
                    "X-Linked-Size": str(stored.size),
                    "Location": f"{self.server.storage_url}/lfs-storage/{stored.sha256}",
                }
            )
            self.send(302, raw=b"", headers=headers)
        else:
            self.send_content(stored.content, headers)


class EmulatorServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.state = state
        self.hub_url = f"http://127.0.0.1:{self.server_address[1]}"
        self.storage_url = self.hub_url  # replaced by the storage server's origin in HubEmulator


class HubEmulator:
    """Two servers sharing one state: the Hub API and, on another port, the LFS object storage."""

    TOKEN = "hf_emulator_write_token"
    USER = "tester"

    def __init__(self) -> None:
        self.state = HubState({self.TOKEN: self.USER})
        self.hub = EmulatorServer(self.state)
        self.storage = EmulatorServer(self.state)
        self.hub.storage_url = self.storage.storage_url = self.storage.hub_url
        self.storage.hub_url = self.hub.hub_url
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.hub, self.storage)]

    @property
    def endpoint(self) -> str:
        return self.hub.hub_url

    def __enter__(self) -> HubEmulator:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for server in (self.hub, self.storage):
            server.shutdown()
            server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The repo's files at ``revision`` with their content (for assertions)."""
        _, files = self.state.repos[repo_id].snapshot(revision)
        return {path: f.content if f.content is not None else self.state.lfs[f.sha256] for path, f in files.items()}
