# vibedom's mitmproxy addon, shipped inside the vibedom binary and written to
# the session's private runtime folder. It is a thin client: every decision
# (SNI and Host against the admitted name, request scrubbing by the DLP,
# WebSocket messages, logging) is asked of vibedom over a private unix
# socket. Whatever goes wrong here -- vibedom unreachable, an answer that
# cannot be read, an exception -- the request is refused (fail closed).
import asyncio
import base64
import json
import os

from mitmproxy import ctx, exceptions, http

SOCK = os.environ.get("VIBEDOM_CTL", "")
BODY_LIMIT = int(os.environ.get("VIBEDOM_BODY_LIMIT", "67108864"))
# Set when vibedom runs mitmweb for `vibedom run --inspect`: the web UI is a
# read-only view of what was sent upstream.
LIVE_VIEW = os.environ.get("VIBEDOM_LIVE_VIEW") == "1"
# Only vibedom's own tests set this (vibedom builds mitmweb's environment
# from scratch): it leaves the web UI's write endpoints open so the tests
# can check the guards behind them.
_TEST_OPEN_UI = os.environ.get("VIBEDOM_TEST_OPEN_UI") == "1"
# The mark the addon puts on a request once vibedom has approved and
# scrubbed it; the live view shows only marked flows.
SENT_MARK = ":outbox_tray:"
_SECRET_OPTIONS = ("proxyauth", "upstream_auth", "web_password")
# The live view keeps at most this many finished flows (mitmweb keeps each
# whole in memory): the oldest go first.
VIEW_MAX = int(os.environ.get("VIBEDOM_VIEW_MAX", "1000"))


def _trim_view():
    view = getattr(ctx.master, "view", None)
    store = getattr(view, "_store", None)
    if store is None or len(store) <= VIEW_MAX:
        return
    old = [f for f in list(store.values())[: len(store) - VIEW_MAX] if not f.live]
    for f in old:
        view.remove([f])


_live = set()


class _Pool:
    def __init__(self, path):
        self.path = path
        self.idle = []

    async def call(self, msg, reply=True):
        # mitmdump 8.1 keeps no strong reference to the task running a
        # hook: hold it while it waits for vibedom, or the garbage collector
        # may destroy it mid-wait (and the flow stalls).
        task = asyncio.current_task()
        _live.add(task)
        try:
            return await self._call(msg, reply)
        finally:
            _live.discard(task)

    async def _call(self, msg, reply):
        if self.idle:
            r, w = self.idle.pop()
        else:
            r, w = await asyncio.open_unix_connection(self.path, limit=1 << 30)
        try:
            w.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
            await w.drain()
            if not reply:
                self.idle.append((r, w))
                return None
            line = await r.readline()
            if not line.endswith(b"\n"):
                raise ConnectionError("vibedom closed the control socket")
            ans = json.loads(line)
        except BaseException:
            w.close()
            raise
        self.idle.append((r, w))
        return ans


_pool = _Pool(SOCK)

# flow id -> (values, replacement) from vibedom's answer to the request,
# taken by the response's headers.
_scrubs = {}


def _replacer(vals, with_):
    """A stream function replacing vals by with_, holding back the last
    len(longest)-1 bytes of each chunk so a value split across chunks is
    still found; the end of the body (b"") releases the rest."""
    hold = max(len(v) for v in vals) - 1
    tail = [b""]

    def f(chunk):
        data = tail[0] + chunk
        for v in vals:
            data = data.replace(v, with_)
        if chunk == b"":
            tail[0] = b""
            return [data] if data else []
        if len(data) <= hold:
            tail[0] = data
            return []
        cut = len(data) - hold
        tail[0] = data[cut:]
        return [data[:cut]]

    return f


def _peer(conn):
    p = conn.peername
    return "%s:%d" % (p[0], p[1]) if p else ""


def _refuse(flow, status, reason):
    flow.response = http.Response.make(
        status,
        ("vibedom: %s\n" % reason).encode(),
        {"Content-Type": "text/plain; charset=utf-8", "X-Vibedom": "refused", "Connection": "close"},
    )
    _forget_request(flow)


def _forget_request(flow):
    # A refused request was never sent: the live view keeps none of it
    # (its path, headers or body), even out of the list.
    if LIVE_VIEW:
        flow.request.path = "/"
        flow.request.headers = http.Headers()
        if flow.request.raw_content is not None:
            flow.request.raw_content = b""


def _guard_web_ui():
    """Makes mitmweb's web UI read-only: every request other than GET or
    HEAD is refused (replay, duplicate, edit, resume, kill, clear, upload,
    options, commands), the options it shows hide the session's secrets,
    and the intercept addon never holds a flow (an edited flow would go
    upstream unchecked)."""
    import tornado.web
    from mitmproxy import optmanager
    from mitmproxy.tools.web import app

    def prepare(self):
        if self.request.method not in ("GET", "HEAD"):
            raise tornado.web.HTTPError(403, reason="vibedom: the live view is read-only")

    def options_get(self):
        d = optmanager.dump_dicts(self.master.options)
        for k in _SECRET_OPTIONS:
            if k in d:
                d[k]["value"] = "(hidden by vibedom)"
        self.write(d)

    if not _TEST_OPEN_UI:
        app.RequestHandler.prepare = prepare
    app.Options.get = options_get


def _no_intercept():
    icpt = ctx.master.addons.get("intercept")
    if icpt is not None:
        icpt.process_flow = lambda f: None


def _fields(headers):
    return [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers.fields]


class Vibedom:
    def __init__(self):
        self._started = False

    def load(self, loader):
        # Any web UI is read-only, whether or not vibedom said it runs one.
        if LIVE_VIEW or hasattr(ctx.master, "app"):
            try:
                _guard_web_ui()
                _no_intercept()
            except Exception as e:
                # A UI vibedom cannot make read-only does not run.
                ctx.log.error("vibedom: cannot make the web UI read-only: %s" % e)
                ctx.master.shutdown()

    def configure(self, updated):
        # The options are vibedom's, fixed for the session: a change from
        # the web UI (intercept, scripts, modes, ...) is rolled back.
        if self._started and updated:
            raise exceptions.OptionsError("vibedom: the options are fixed for the session")

    def done(self):
        # Unloaded (the scripts option changed) or stopping: either way no
        # flow may pass without this addon.
        try:
            ctx.master.shutdown()
        except Exception:
            pass

    async def running(self):
        self._started = True
        try:
            r, w = await asyncio.open_unix_connection(SOCK)
            w.write(json.dumps({"op": "hello", "pid": os.getpid()}).encode() + b"\n")
            await w.drain()
            if not (await r.readline()).endswith(b"\n"):
                raise ConnectionError("no answer")
        except Exception as e:
            ctx.log.error("vibedom: control socket unreachable: %s" % e)
            ctx.master.shutdown()
            return
        # This connection stays open for the session: when vibedom goes
        # away (even killed), it ends, and so does mitmdump.
        self._watch = asyncio.ensure_future(self._watchdog(r, w))

    async def _watchdog(self, r, w):
        try:
            while await r.read(4096):
                pass
        except Exception:
            pass
        ctx.log.error("vibedom: the session is gone; stopping")
        ctx.master.shutdown()

    async def tls_clienthello(self, data):
        try:
            ans = await _pool.call({"op": "sni", "peer": _peer(data.context.client), "sni": data.client_hello.sni or ""})
            ok = ans.get("action") == "allow"
        except Exception:
            ok = False
        if not ok:
            # vibedom has already closed the guest's side, and refuses every
            # request of a TLS connection whose SNI it did not approve.
            ctx.log.info("vibedom refused a TLS handshake")

    def requestheaders(self, flow):
        # A replay (or a replayed duplicate) from the web UI never goes out.
        if flow.is_replay:
            flow.kill()
            return
        # The DLP reads the request whole: never stream it past the check.
        flow.request.stream = False
        try:
            too_big = int(flow.request.headers.get("content-length", "0")) > BODY_LIMIT
        except ValueError:
            too_big = True
        if too_big:
            _forget_request(flow)
            flow.kill()

    async def request(self, flow):
        # Any failure, here or in applying the answer, refuses the request:
        # mitmproxy would otherwise send it on as it stands.
        try:
            await self._request(flow)
        except Exception as e:
            _refuse(flow, 502, "the content filter failed (%s); nothing was sent" % type(e).__name__)

    async def _request(self, flow):
        req = flow.request
        if flow.is_replay:
            flow.kill()
            return
        if len(req.raw_content or b"") > BODY_LIMIT:
            _refuse(flow, 413, "the request body is over the mitmproxy engine's limit of %d bytes" % BODY_LIMIT)
            return
        ans = await _pool.call({
            "op": "request",
            "peer": _peer(flow.client_conn),
            "id": flow.id,
            "scheme": req.scheme,
            "method": req.method,
            "host": req.host_header or "",
            "authority": req.authority if req.http_version.startswith("HTTP/1") else "",
            "dhost": req.host,
            "dport": req.port,
            "path": req.path,
            "proto": req.http_version,
            "headers": _fields(req.headers),
            "body": base64.b64encode(req.raw_content or b"").decode(),
            "replay": bool(flow.is_replay),
        })
        if ans.get("action") != "allow":
            _refuse(flow, int(ans.get("status") or 403), ans.get("reason") or "refused")
            return
        method, path = ans["method"], ans["path"]
        headers = http.Headers([(k.encode("latin-1"), v.encode("latin-1")) for k, v in ans.get("headers") or []])
        body = base64.b64decode(ans.get("body") or "")
        req.method, req.path, req.headers, req.raw_content = method, path, headers, body
        flow.marked = SENT_MARK
        scrub = [base64.b64decode(v) for v in ans.get("scrub") or []]
        if scrub:
            # Kept here, not on the flow: the live view shows a flow's
            # metadata.
            _scrubs[flow.id] = (scrub, base64.b64decode(ans.get("scrub_with") or ""))

    def responseheaders(self, flow):
        # Stream the response, counting the bytes; when vibedom named
        # values to scrub (real credentials a provider might echo back),
        # replace them in the headers and, as it streams, in the body.
        n = [0]
        scrub = _scrubs.pop(flow.id, None)
        repl = _replacer(*scrub) if scrub else None
        if scrub:
            vals, with_ = scrub
            fields = []
            for k, v in flow.response.headers.fields:
                for x in vals:
                    v = v.replace(x, with_)
                fields.append((k, v))
            flow.response.headers = http.Headers(fields)
            if flow.request.method.upper() != "HEAD" and "content-length" in flow.response.headers:
                # The length changes with a replacement.
                del flow.response.headers["content-length"]
                if flow.request.http_version.startswith("HTTP/1"):
                    flow.response.headers["transfer-encoding"] = "chunked"

        def count(chunk):
            n[0] += len(chunk)
            if repl is None:
                return chunk
            return repl(chunk)

        flow.response.stream = count
        flow.metadata["vibedom_down"] = n

    async def response(self, flow):
        if flow.response.status_code == 101:
            try:
                await _pool.call({"op": "status", "id": flow.id, "status": 101}, reply=False)
            except Exception:
                pass
            return
        if flow.response.headers.get("X-Vibedom") == "refused":
            return
        await self._done(flow, "")

    async def error(self, flow):
        await self._done(flow, str(flow.error) if flow.error else "error")

    async def websocket_message(self, flow):
        msg = flow.websocket.messages[-1]
        if msg.injected:
            # Sent from the web UI, not by the guest: never relayed.
            msg.content = b""
            msg.drop()
            return
        if not msg.from_client:
            return
        try:
            ans = await _pool.call({"op": "ws", "id": flow.id, "text": msg.is_text,
                                    "body": base64.b64encode(msg.content).decode()})
            ok = ans.get("action") == "allow"
        except Exception:
            ok = False
        if not ok:
            msg.content = b""  # the live view never shows what was refused
            msg.drop()
            flow.kill()
            return
        try:
            msg.content = base64.b64decode(ans.get("body") or "")
        except Exception:
            msg.drop()
            flow.kill()

    async def websocket_end(self, flow):
        await self._done(flow, "")

    async def _done(self, flow, err):
        _scrubs.pop(flow.id, None)
        if LIVE_VIEW:
            try:
                _trim_view()
            except Exception as e:
                ctx.log.warn("vibedom: cannot trim the live view: %s" % e)
        try:
            resp = flow.response
            await _pool.call({
                "op": "done", "id": flow.id, "status": resp.status_code if resp else 0,
                "down": flow.metadata.get("vibedom_down", [0])[0], "error": err,
            }, reply=False)
        except Exception:
            pass


addons = [Vibedom()]
