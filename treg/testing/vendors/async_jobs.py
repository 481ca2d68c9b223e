"""A fake async-job vendor on 127.0.0.1 and the third-party plugin file declaring it (loaded through
TREG_PLUGINS_DIR, no core edit), for the async jobs' tests (tests/test_async_jobs.py).

The vendor ("vidgen", one shared account): ``POST /v1/videos``, ``/v1/render`` and ``/v1/thumbs`` start a job and
answer ``{"data": {"task_id": "t<n>"}}`` (``{"reject": true}`` in the body: a 200 with no task id);
``GET /v1/tasks/<id>`` answers the job's status as a test set it, with ``result.file_id`` and, once
given, ``usage.seconds``; ``GET /v1/files/<file id>`` serves the job's bytes, honouring ``Range``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treg.testing.upstreams import Exchange, http_response

PLUGIN = '''"""A third-party provider plugin: an async video vendor (loaded from TREG_PLUGINS_DIR)."""
from treg import hookimpl

BASE_URL = {base_url!r}
ASYNC = {{"task_id": "data.task_id", "poll": "vidgen.tasks.get", "fetch": "vidgen.files.get", "task_param": "id",
          "status_path": "status", "done": ["completed"], "failed": ["failed", "cancelled"],
          "result_id_path": "result.file_id", "price_on": "done"}}


@hookimpl
def treg_register_providers():
    return [{{
        "id": "vidgen", "base_url": BASE_URL,
        "auth": [{{"location": "header", "name": "Authorization", "format": "Bearer {{secret}}"}}],
        "endpoints": [
            {{"id": "vidgen.videos.create", "method": "POST", "path": "/videos", "params": [],
              "price": {{"per_call_micro": 5000}}, "async": ASYNC}},
            {{"id": "vidgen.render", "method": "POST", "path": "/render", "params": [],
              "price": {{"usage": [{{"path": "usage.seconds", "micro_per_unit": 100}}], "estimate_micro": 9000}},
              "async": ASYNC}},
            {{"id": "vidgen.thumbs.create", "method": "POST", "path": "/thumbs", "params": [],
              "price": {{"per_call_micro": 700}}, "async": dict(ASYNC, price_on="submit")}},
            {{"id": "vidgen.tasks.get", "method": "GET", "path": "/tasks/{{id}}",
              "params": [{{"name": "id", "in": "path"}}], "price": {{"per_call_micro": 0}}}},
            {{"id": "vidgen.files.get", "method": "GET", "path": "/files/{{id}}",
              "params": [{{"name": "id", "in": "path"}}], "price": {{"per_call_micro": 0}}}},
        ],
    }}]
'''

PLATFORM_KEY = "vidgen-platform-key-0123"


def write_plugin(folder: Path, base_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vidgen.py"
    path.write_text(PLUGIN.format(base_url=base_url))
    return folder


@dataclass
class Job:
    status: str = "running"
    seconds: int | None = None
    data: bytes = b""


@dataclass
class Vendor:
    """The fake vendor's state; ``respond`` is the raw upstream's responder."""

    jobs: dict[str, Job] = field(default_factory=dict)
    file_size: int = 1000
    submissions: int = 0

    def job(self, task_id: str) -> Job:
        return self.jobs[task_id]

    def respond(self, ex: Exchange) -> bytes:
        method, target = ex.method, ex.target
        path = target.partition("?")[0]
        if method == "POST" and path in ("/v1/videos", "/v1/render", "/v1/thumbs"):
            body: Any = json.loads(ex.body or b"{}")
            if body.get("reject"):
                return _json(200, {"queued": False})
            self.submissions += 1
            task_id = f"t{self.submissions}"
            self.jobs[task_id] = Job(data=bytes(i % 251 for i in range(self.file_size)))
            return _json(200, {"data": {"task_id": task_id}})
        m = re.fullmatch(r"/v1/tasks/([^/]+)", path)
        if method == "GET" and m:
            job = self.jobs.get(m.group(1))
            if job is None:
                return _json(404, {"error": "no such task"})
            answer: dict[str, Any] = {"status": job.status, "result": {"file_id": f"f-{m.group(1)}"}}
            if job.seconds is not None:
                answer["usage"] = {"seconds": job.seconds}
            return _json(200, answer)
        m = re.fullmatch(r"/v1/files/f-([^/]+)", path)
        if method == "GET" and m and m.group(1) in self.jobs:
            data = self.jobs[m.group(1)].data
            rng = ex.header("Range")
            if rng:
                a, b = (int(x) for x in rng.removeprefix("bytes=").split("-"))
                part = data[a:b + 1]
                return http_response(206, part, [("Content-Type", "video/mp4"),
                                                 ("Content-Range", f"bytes {a}-{b}/{len(data)}")],
                                     reason="Partial Content")
            return http_response(200, data, [("Content-Type", "video/mp4"), ("Accept-Ranges", "bytes")])
        return _json(404, {"error": "not found"})


def _json(status: int, obj: Any) -> bytes:
    return http_response(status, json.dumps(obj).encode(), [("Content-Type", "application/json")],
                         reason="OK" if status < 400 else "Not Found")
