"""A tiny webhook receiver for the docker-compose demo (standard library only).

It logs every POST, checks the Standard Webhooks signature when WEBHOOK_SECRET or
WEBHOOK_SECRET_FILE is set, deduplicates by `webhook-id` (the relay sends the same id on every
attempt of a row, so a receiver can drop the rare duplicate), and answers:

  204  accepted (and 200 for a duplicate it had already accepted);
  401  bad or missing signature;
  410  payload {"demo": "fail"}: a permanent failure, so the row becomes FAILED
       (try `outbox-relay failed` and `outbox-relay requeue`);
  503  payload {"demo": "flaky"}: every other attempt, so the row is retried.

Environment: PORT (default 8080), WEBHOOK_SECRET / WEBHOOK_SECRET_FILE.
Not for production: it keeps every id it saw in memory.
"""

import base64
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECONDS = 300


def load_key():
    secret = os.environ.get("WEBHOOK_SECRET", "")
    path = os.environ.get("WEBHOOK_SECRET_FILE")
    if path:
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
    if not secret:
        return None
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_"):])
    return secret.encode()


KEY = load_key()
SEEN = set()
FLAKY = {}
# Requests are handled on several threads. Each line goes out in one write, under a lock:
# print() writes the line and its newline separately, and lines of two threads interleaved
# ({...}{...} and then two newlines).
LOG_LOCK = threading.Lock()


def log(**fields):
    fields["ts"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps(fields, sort_keys=True) + "\n"
    with LOG_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def signature_ok(msg_id, timestamp, body, header):
    if KEY is None:
        return True
    try:
        if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
            return False
    except (TypeError, ValueError):
        return False
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    # The header may carry several space-separated "v1,<sig>" entries (key rotation).
    for entry in (header or "").split():
        version, _, sig = entry.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            return True
    return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.answer(200, b"ok\n")

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        msg_id = self.headers.get("webhook-id")
        if not signature_ok(
            msg_id,
            self.headers.get("webhook-timestamp"),
            body,
            self.headers.get("webhook-signature"),
        ):
            log(event="rejected", reason="bad signature", path=self.path, id=msg_id)
            return self.answer(401)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        demo = payload.get("demo") if isinstance(payload, dict) else None
        if demo == "fail":
            log(event="refused", status=410, path=self.path, id=msg_id)
            return self.answer(410, b"gone\n")
        if demo == "flaky":
            FLAKY[msg_id] = FLAKY.get(msg_id, 0) + 1
            if FLAKY[msg_id] % 2 == 1:
                log(event="refused", status=503, path=self.path, id=msg_id)
                return self.answer(503, b"try again\n")
        if msg_id in SEEN:
            log(event="duplicate", path=self.path, id=msg_id)
            return self.answer(200, b"duplicate\n")
        SEEN.add(msg_id)
        log(
            event="received",
            path=self.path,
            id=msg_id,
            signed=KEY is not None,
            payload=payload,
        )
        return self.answer(204)

    def answer(self, status, body=b""):
        self.send_response(status)
        if status != 204:  # a 204 carries no body and no content-length
            self.send_header("content-length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, fmt, *args):  # the JSON lines above replace the access log
        pass


def main():
    # In a container this is PID 1, which the kernel gives no default action for SIGTERM:
    # without a handler `docker compose stop` waits its 10 seconds and then kills it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    port = int(os.environ.get("PORT", "8080"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    log(event="listening", port=port, signed=KEY is not None)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
