"""A Hugging Face Hub on localhost: the routes ``huggingface_hub`` downloads through.

Real HTTP, real ``huggingface_hub`` client: tests point ``HF_ENDPOINT`` here. The routes and
headers are the hub's, as the installed client reads them (``hf_api.repo_info`` /
``list_repo_tree``, ``file_download.get_hf_file_metadata`` / ``http_get``,
``utils._http.hf_raise_for_status``):

- ``GET /api/models/{repo}[/revision/{rev}]``: ``id``, ``sha`` (the commit), ``siblings``;
- ``GET /api/models/{repo}/tree/{rev}``: files with ``oid``, ``size`` and, for LFS files,
  ``lfs`` (``oid`` = sha256, ``size``, ``pointerSize``);
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (the git blob id),
  ``Content-Length``; LFS files (weights) answer ``302`` to a second origin, the "CDN",
  with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``, as the hub does;
- errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``) and ``X-Error-Message``, which the client turns into its exceptions.

Every request is recorded, so a test can count what a second download asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth", ".onnx")
_POINTER_SIZE = 134


@dataclass
class HubRepo:
    """One repository: refs (branches and tags) pointing at commits, each a set of files."""

    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    token: str | None = None  # gated: files need "Authorization: Bearer <token>"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    authorized: bool


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalHub:
    """Two threaded HTTP servers on 127.0.0.1: the hub, and the CDN its LFS files redirect to."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> content, for the CDN
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=True))
        self._threads = [threading.Thread(target=server.serve_forever, daemon=True)
                         for server in (self._hub, self._cdn)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def start(self) -> LocalHub:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    # ------------------------------------------------------------------ content

    def publish(self, repo_id: str, files: Mapping[str, bytes], revision: str = "main") -> str:
        """Commit ``files`` (path -> content) as ``revision`` of ``repo_id``; the commit id."""
        repo = self.repos.setdefault(repo_id, HubRepo())
        digest = hashlib.sha1(f"{repo_id}@{revision}".encode())
        for path in sorted(files):
            digest.update(path.encode() + git_blob_id(files[path]).encode())
        commit = digest.hexdigest()
        repo.commits[commit] = dict(files)
        repo.refs[revision] = commit
        for data in files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        return commit

    def publish_folder(self, repo_id: str, folder: Path, revision: str = "main",
                       extra: Mapping[str, bytes] | None = None) -> str:
        files = {p.relative_to(folder).as_posix(): p.read_bytes()
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.publish(repo_id, {**files, **(extra or {})}, revision)

    def gate(self, repo_id: str, token: str) -> None:
        self.repos[repo_id].token = token

    # ------------------------------------------------------------------ inspection

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def file_requests(self, since: int = 0) -> list[Request]:
        """Requests for file contents or metadata (resolve and CDN), not API calls."""
        return [r for r in self.requests[since:]
                if "/resolve/" in r.path or r.path.startswith("/cdn/")]


def _handler(hub: LocalHub, cdn: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    Handler.cdn = cdn
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    hub: LocalHub
    cdn: bool
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the test reads hub.requests instead

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    # ------------------------------------------------------------------ routing

    def _answer(self, head: bool) -> None:
        path = urlsplit(self.path).path
        auth = self.headers.get("Authorization", "")
        self.hub.record(Request(self.command, path, auth.startswith("Bearer ")))
        if self.cdn:
            data = self.hub.blobs.get(path.removeprefix("/cdn/"))
            if data is None:
                return self._send(404, b"", head)
            return self._send(200, data, head, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._api(parts[2] + "/" + parts[3], parts[4:], head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]),
                                 auth, head)
        self._error(404, "EntryNotFound", "no such route", head)

    def _commit(self, repo_id: str, revision: str, head: bool) -> tuple[HubRepo, str] | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None
        commit = repo.refs.get(revision, revision if revision in repo.commits else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
            return None
        return repo, commit

    def _api(self, repo_id: str, rest: list[str], head: bool) -> None:
        revision = "main"
        if rest[:1] in (["revision"], ["tree"]) and len(rest) >= 2:
            revision = rest[1]
        found = self._commit(repo_id, revision, head)
        if found is None:
            return
        repo, commit = found
        files = repo.commits[commit]
        if rest[:1] == ["tree"]:
            body: Any = [_tree_entry(name, data) for name, data in sorted(files.items())]
        else:
            body = {"id": repo_id, "sha": commit, "private": False,
                    "gated": "manual" if repo.token else False, "disabled": False,
                    "siblings": [{"rfilename": name} for name in sorted(files)]}
        self._send(200, json.dumps(body).encode(), head, {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, revision: str, file: str, auth: str, head: bool) -> None:
        found = self._commit(repo_id, revision, head)
        if found is None:
            return
        repo, commit = found
        if repo.token is not None and auth != f"Bearer {repo.token}":
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You "
                               "must have access to it and be authenticated to access it.", head)
        data = repo.commits[commit].get(file)
        if data is None:
            return self._error(404, "EntryNotFound", f"{file} does not exist", head,
                               {"X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_id(data)}"'}
        if file.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            headers |= {"Location": f"{self.hub.cdn_url}/cdn/{sha256}",
                        "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(data))}
            return self._send(302, b"", head, headers)
        self._send(200, data, head, headers)

    # ------------------------------------------------------------------ replies

    def _error(self, status: int, code: str, message: str, head: bool,
               headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, head, {"X-Error-Code": code, "X-Error-Message": message,
                                        "Content-Type": "application/json", **(headers or {})})

    def _send(self, status: int, body: bytes, head: bool,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _tree_entry(name: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "path": name, "size": len(data),
                             "oid": git_blob_id(data)}
    if name.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                        "pointerSize": _POINTER_SIZE}
    return entry
