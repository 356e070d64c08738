"""A Hub-compatible HTTP server on loopback, for upload/download tests without network.

It speaks the endpoints that ``huggingface_hub`` calls to create a repo and a branch, validate a card,
ask upload modes (``preupload``: every file "regular", so no LFS/Xet transfer) and commit (NDJSON with
base64 contents), and the ones that downloads use (model info, ``resolve`` with HEAD/GET and the
``X-Repo-Commit``/``ETag`` headers, ``X-Error-Code`` on misses). Repos live in memory, with branches
pointing at commits that each hold a full file tree. Every request is recorded (method, path, lower-cased headers)
so tests can check what a client sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Repo:
    def __init__(self, private: bool):
        self.private = private
        self.commits: dict[str, dict[str, bytes]] = {}
        self.branches: dict[str, str] = {}
        root = self._store({})
        self.branches["main"] = root

    def _store(self, files: dict[str, bytes]) -> str:
        sha = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
                           + str(len(self.commits)).encode()).hexdigest()
        self.commits[sha] = files
        return sha

    def resolve(self, rev: str) -> str | None:
        return self.branches.get(rev) or (rev if rev in self.commits else None)

    def commit(self, branch: str, changes: dict[str, bytes | None]) -> str:
        files = dict(self.commits[self.branches[branch]])
        for path, content in changes.items():
            if content is None:
                files.pop(path, None)
            else:
                files[path] = content
        sha = self._store(files)
        self.branches[branch] = sha
        return sha


class HubState:
    def __init__(self, token: str):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.fail_commits = 0  # make the next N commit requests fail with a 500
        self.fault: str | None = None  # every POST: "hang" (no answer until released), "drop" (close the
        # connection unanswered), "echo" (a 500 whose message repeats the request's Authorization header)
        self.released = threading.Event()  # ends every hang
        self.lock = threading.Lock()


def _handler(state: HubState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        # -- helpers ---------------------------------------------------------------------------
        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                return self.rfile.read(n)
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return b""

        def _send(self, code: int, payload=None, headers: dict[str, str] | None = None, body: bytes | None = None,
                  head: bool = False):
            data = body if body is not None else (json.dumps(payload).encode() if payload is not None else b"")
            self.send_response(code)
            self.send_header("Content-Type", "application/json" if body is None else "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _error(self, code: int, error_code: str, message: str, head: bool = False):
            self._send(code, {"error": message}, {"X-Error-Code": error_code, "X-Error-Message": message}, head=head)

        def _authorized(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {state.token}"

        def _record(self):
            state.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))

        # -- routes ----------------------------------------------------------------------------
        def _faulty(self) -> bool:
            """Act out ``state.fault``; True when the request got no ordinary answer."""
            if state.fault == "hang":
                state.released.wait(120)
                self.close_connection = True
            elif state.fault == "drop":
                self.close_connection = True
            elif state.fault == "echo":
                self._error(500, "Internal", f"cannot parse request with Authorization: "
                            f"{self.headers.get('Authorization')}")
            return state.fault is not None

        def do_POST(self):
            self._record()
            path = urllib.parse.urlparse(self.path).path
            body = self._body()
            if self._faulty():
                return
            if not self._authorized():
                return self._error(401, "Unauthorized", "Invalid credentials in Authorization header")
            parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
            with state.lock:
                if path == "/api/repos/create":
                    req = json.loads(body)
                    repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    url = f"http://{self.headers['Host']}/{repo_id}"
                    if repo_id in state.repos:  # the Hub answers 409 with the repo's url
                        return self._send(409, {"error": "You already created this model repo", "url": url},
                                          {"X-Error-Message": "You already created this model repo"})
                    state.repos[repo_id] = Repo(req.get("visibility") == "private" or bool(req.get("private")))
                    return self._send(200, {"url": url})
                if path == "/api/validate-yaml":
                    return self._send(200, {})
                # /api/models/{ns}/{name}/{action}/{rev}
                if len(parts) >= 6 and parts[:2] == ["api", "models"]:
                    repo_id, action, rev = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
                    repo = state.repos.get(repo_id)
                    if repo is None:
                        return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
                    if action == "branch":
                        if rev in repo.branches:
                            return self._error(409, "BranchExists", f"branch {rev} already exists")
                        start = (json.loads(body) if body else {}).get("startingPoint") or "main"
                        repo.branches[rev] = repo.resolve(start)
                        return self._send(200, {})
                    if repo.resolve(rev) is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                           "shouldIgnore": False} for f in files]})
                    if action == "commit":
                        if state.fail_commits > 0:
                            state.fail_commits -= 1
                            return self._error(500, "Internal", "the server fell over")
                        changes: dict[str, bytes | None] = {}
                        for line in body.decode().splitlines():
                            item = json.loads(line)
                            if item["key"] == "file":
                                changes[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                            elif item["key"] == "deletedFile":
                                changes[item["value"]["path"]] = None
                            elif item["key"] != "header":
                                return self._error(400, "BadRequest", f"unsupported commit item {item['key']}")
                        sha = repo.commit(rev, changes)
                        return self._send(200, {"commitUrl": f"http://{self.headers['Host']}/{repo_id}/commit/{sha}",
                                                "commitOid": sha, "pullRequestUrl": None})
            return self._error(404, "NotFound", f"no route for POST {path}")

        def _files_of(self, repo_id: str, rev: str, head: bool = False):
            repo = state.repos.get(repo_id)
            if repo is None or (repo.private and not self._authorized()):
                self._error(401, "RepoNotFound", f"Repository Not Found for url: {self.path}", head=head)
                return None, None
            sha = repo.resolve(rev)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
                return None, None
            return sha, repo.commits[sha]

        def do_GET(self, head: bool = False):
            self._record()
            path = urllib.parse.urlparse(self.path).path
            parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
            # /api/models/{ns}/{name}[/revision/{rev}]
            if len(parts) >= 4 and parts[:2] == ["api", "models"]:
                repo_id = f"{parts[2]}/{parts[3]}"
                rev = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
                if len(parts) > 4 and parts[4] not in ("revision",):
                    return self._error(404, "EntryNotFound", f"no such path {path}", head=head)
                sha, files = self._files_of(repo_id, rev, head)
                if sha is None:
                    return
                return self._send(200, {"id": repo_id, "modelId": repo_id, "sha": sha,
                                        "private": state.repos[repo_id].private,
                                        "siblings": [{"rfilename": f} for f in sorted(files)]}, head=head)
            # /{ns}/{name}/resolve/{rev}/{path...}
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, rev, file = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
                sha, files = self._files_of(repo_id, rev, head)
                if sha is None:
                    return
                if file not in files:
                    return self._send(404, {"error": "Entry not found"},
                                      {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, head=head)
                content = files[file]
                etag = '"' + hashlib.sha1(content).hexdigest() + '"'
                return self._send(200, headers={"X-Repo-Commit": sha, "ETag": etag}, body=content, head=head)
            return self._error(404, "NotFound", f"no route for GET {path}", head=head)

        def do_HEAD(self):
            self.do_GET(head=True)

    return Handler


class HubServer:
    """``with HubServer(token) as hub: hub.url``: a server on 127.0.0.1 (a free port), in a thread."""

    def __init__(self, token: str):
        self.state = HubState(token)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.state.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
