# vibedom's mitmproxy addon, shipped inside the vibedom binary and written to
# the session's private runtime folder. It is a thin client: every decision
# (SNI and Host against the admitted name, request scrubbing by the DLP,
# WebSocket messages, logging) is asked of vibedom over a private unix
# socket. Whatever goes wrong here -- vibedom unreachable, an answer that
# cannot be read, an exception -- the request is refused (fail closed).
import asyncio
import base64
import dataclasses
import hmac
import json
import os
import re
import socket

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
# The live view's per-session token: the URL vibedom prints carries it
# (?token=...), which sets a cookie; every other request is refused.
VIEW_TOKEN = os.environ.get("VIBEDOM_VIEW_TOKEN", "")
# A request body larger than this is not kept in the live view (mitmweb
# would hold it in memory until the flow is dropped).
VIEW_BODY_MAX = 1 << 20

# The real credentials vibedom swaps in (from its answers), each with what
# replaces it wherever it could reach the guest or the live view.
_secrets = {}


def _learn(vals, with_):
    for v in vals:
        if v:
            _secrets[v] = with_


def _redact(b):
    for v, w in _secrets.items():
        if v in b:
            b = b.replace(v, w)
    return b


def _redact_s(s):
    if not _secrets or not s:
        return s
    return _redact(s.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")


def _redact_short(b):
    # For WebSocket control frames (at most 125 bytes): a replacement no
    # longer than the value.
    for v in _secrets:
        if v in b:
            b = b.replace(v, b"[REDACTED]"[: len(v)])
    return b


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

    async def call(self, msg, reply=True, body=None):
        # mitmdump 8.1 keeps no strong reference to the task running a
        # hook: hold it while it waits for vibedom, or the garbage collector
        # may destroy it mid-wait (and the flow stalls).
        task = asyncio.current_task()
        _live.add(task)
        try:
            return await self._call(msg, reply, body)
        finally:
            _live.discard(task)

    async def _call(self, msg, reply, body):
        if self.idle:
            r, w = self.idle.pop()
        else:
            r, w = await asyncio.open_unix_connection(self.path, limit=1 << 27)
        try:
            # A request body goes raw after the line, a window at a time
            # (never base64 in it, never a second whole copy here).
            if body:
                msg["blen"] = len(body)
            w.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
            if body:
                mv = memoryview(body)
                for i in range(0, len(mv), 1 << 20):
                    w.write(mv[i : i + (1 << 20)])
                    await w.drain()
            await w.drain()
            if not reply:
                self.idle.append((r, w))
                return None
            line = await r.readline()
            if not line.endswith(b"\n"):
                raise ConnectionError("vibedom closed the control socket")
            ans = json.loads(line)
            n = ans.get("blen") or 0
            ans["_body"] = await r.readexactly(n) if n else b""
        except BaseException:
            w.close()
            raise
        self.idle.append((r, w))
        return ans


_pool = _Pool(SOCK)

# Flows whose request went out with vibedom's answer applied (real
# credentials in it) and was not yet put back for the live view:
# flow id -> the guest's own header values, by lower-case name.
_unsent = {}


def _replacer():
    """A stream function replacing the real credentials, holding back the
    last len(longest)-1 bytes of each chunk so a value split across chunks
    is still found; the end of the body (b"") releases the rest."""
    tail = [b""]

    def f(chunk):
        hold = max((len(v) for v in _secrets), default=1) - 1
        data = _redact(tail[0] + chunk)
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


def _redact_name(k):
    # Header names are case-insensitive (HTTP/2 lowercases them): matched
    # so, and replaced by a valid name.
    kl = k.lower()
    for v in _secrets:
        vl = v.lower()
        i = kl.find(vl)
        while i >= 0:
            k = k[:i] + b"REDACTED" + k[i + len(v) :]
            kl = k.lower()
            i = kl.find(vl, i + 8)
    return k


def _headers(fields, h2):
    # vibedom answers with canonical names; HTTP/2 wants them lower-case
    # (mitmdump sends trailers as they are, and h2 refuses them otherwise).
    return http.Headers([((k.lower() if h2 else k).encode("latin-1"), v.encode("latin-1")) for k, v in fields or []])


class _BodyStream:
    """A provider's response body fed through vibedom's response scrubber
    (the Go engine's: decoded, every form of the key replaced, an event
    stream event by event), a chunk at a time. mitmproxy calls a stream
    function synchronously, so this talks to vibedom over a blocking
    connection of its own; vibedom answers as soon as its scrubber waits
    for more. Once anything fails, nothing more of the body is passed."""

    def __init__(self, fid):
        self.id = fid
        self.failed = None
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(60)
        self.s.connect(SOCK)
        self.r = self.s.makefile("rb")

    def feed(self, chunk, end):
        if self.failed:
            return b""
        try:
            msg = {"op": "rbody", "id": self.id, "end": end}
            if chunk:
                msg["blen"] = len(chunk)
            self.s.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n" + chunk)
            line = self.r.readline()
            if not line.endswith(b"\n"):
                raise ConnectionError("vibedom closed the control socket")
            ans = json.loads(line)
            n = ans.get("blen") or 0
            data = self.r.read(n) if n else b""
            if len(data) != n:
                raise ConnectionError("vibedom closed the control socket")
            if ans.get("action") != "allow":
                self.failed = ans.get("reason") or "refused"
                return b""
            return data
        except Exception as e:
            self.failed = "the response scrubber failed (%s)" % type(e).__name__
            return b""

    def close(self):
        try:
            self.r.close()
            self.s.close()
        except Exception:
            pass


_INFORMATIONAL = re.compile(rb"HTTP/1\.[01] 1(0[02-9]|[1-9][0-9]) ")


def _swallow_informational():
    """mitmdump reads an HTTP/1 1xx response other than 101 (103 Early
    Hints) as the final one, then stalls on the real one: the upstream side
    drops each such header block (as mitmdump does on HTTP/2), so the
    request completes and those headers never reach the guest."""
    from mitmproxy.proxy import events
    from mitmproxy.proxy.layers.http import _http1

    orig = _http1.Http1Client.read_headers

    def read_headers(self, event):
        if isinstance(event, events.DataReceived) and self.request:
            while _INFORMATIONAL.match(bytes(self.buf)[:16]):
                if self.buf.maybe_extract_lines() is None:
                    break
        yield from orig(self, event)

    _http1.Http1Client.read_headers = read_headers


class _TrailerReader:
    """An HTTP/1 body reader that takes the trailers off the message's end
    (mitmdump 8 to 11 fail on them and leave the connection hanging), for
    _relay_http1_trailers to pass on."""

    def __init__(self, r):
        self.r = r
        self.trailers = None

    def __call__(self, buf):
        return self._take(self.r(buf))

    def read_eof(self):
        return self._take(self.r.read_eof())

    def _take(self, ev):
        import h11

        if isinstance(ev, h11.EndOfMessage) and ev.headers:
            raw = ev.headers.raw_items() if hasattr(ev.headers, "raw_items") else list(ev.headers)
            self.trailers = http.Headers([(bytes(k), bytes(v)) for k, v in raw])
            return h11.EndOfMessage()
        return ev


def _trailer_block(t):
    """The last chunk of an HTTP/1 chunked body, carrying trailers t."""
    lines = b"".join(k + b": " + v + b"\r\n" for k, v in t.fields if not re.search(rb"[\r\n\0]", k + v))
    return b"0\r\n" + lines + b"\r\n"


def _relay_http1_trailers():
    """HTTP/1 trailers, which mitmdump 8.1 can neither read nor write,
    take the path HTTP/2 ones do. A provider's response trailers reach the
    response hook (which scrubs them) and a guest on HTTP/1 gets them after
    the last chunk; a guest's request trailers reach the request hook
    (which has vibedom scrub them as headers) and an HTTP/1 upstream gets
    them after the last chunk, the request sent chunked. Without this
    mitmdump stops at the trailers: the other side waits forever (the
    guest for the response's end, or for an answer to its request)."""
    from mitmproxy.proxy import commands
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp
    from mitmproxy.proxy.layers.http._events import (
        RequestEndOfMessage, RequestHeaders, RequestTrailers, ResponseEndOfMessage, ResponseTrailers)

    def wrap_read(cls, trailers_event):
        orig_read = cls.read_body

        def read_body(self, event):
            br = self.body_reader
            if not isinstance(br, _TrailerReader):
                self.body_reader = br = _TrailerReader(br)
            gen, sent = orig_read(self, event), None
            while True:
                try:
                    cmd = gen.send(sent)
                except StopIteration:
                    return
                if br.trailers is not None and isinstance(cmd, ReceiveHttp) and isinstance(cmd.event, self.ReceiveEndOfMessage):
                    yield ReceiveHttp(trailers_event(cmd.event.stream_id, br.trailers))
                    br.trailers = None
                sent = yield cmd

        cls.read_body = read_body

    def wrap_send(cls, trailers_event, end_event, chunked):
        orig_send = cls.send

        def send(self, event):
            if isinstance(event, trailers_event):
                self.vibedom_trailers = event.trailers  # sent with the last chunk
                return
            t = None
            if isinstance(event, end_event):
                t, self.vibedom_trailers = getattr(self, "vibedom_trailers", None), None
            elif isinstance(event, RequestHeaders) and event.request.trailers and not chunked(event.request):
                # Trailers go only with a chunked body: the request is
                # sent so (its length, if any, dropped).
                r = event.request.copy()
                r.headers.pop("content-length", None)
                r.headers["transfer-encoding"] = "chunked"
                event = dataclasses.replace(event, request=r)
            gen, sent = orig_send(self, event), None
            while True:
                try:
                    cmd = gen.send(sent)
                except StopIteration:
                    return
                if t and isinstance(cmd, commands.SendData) and bytes(cmd.data) == b"0\r\n\r\n":
                    self.vibedom_trailers = None
                    cmd = commands.SendData(cmd.connection, _trailer_block(t))
                sent = yield cmd

        cls.send = send

    def chunked(r):
        return "chunked" in r.headers.get("transfer-encoding", "").lower()

    wrap_read(_http1.Http1Client, ResponseTrailers)
    wrap_read(_http1.Http1Server, RequestTrailers)
    wrap_send(_http1.Http1Server, ResponseTrailers, ResponseEndOfMessage, chunked)
    wrap_send(_http1.Http1Client, RequestTrailers, RequestEndOfMessage, chunked)


def _peer(conn):
    p = conn.peername
    return "%s:%d" % (p[0], p[1]) if p else ""


def _refuse(flow, status, reason, refusal=None):
    # The Go side words the refusal (X-Vibedom-Refused, text or JSON as the
    # request's Accept asks); a bare reason is the fallback.
    refusal = refusal or {}
    flow.response = http.Response.make(
        status,
        (refusal.get("text") or "vibedom: %s\n" % reason).encode(),
        {
            "Content-Type": refusal.get("ctype") or "text/plain; charset=utf-8",
            "X-Vibedom": "refused",
            "X-Vibedom-Refused": refusal.get("refused") or "-",
            "Connection": "close",
        },
    )
    # Marked on the flow, not read back from the header: upstream could
    # send that header too.
    flow.metadata["vibedom_refused"] = True
    _forget_request(flow)


def _forget_request(flow):
    # A refused request was never sent: the live view keeps none of it
    # (its path, headers or body), even out of the list.
    _unsent.pop(flow.id, None)
    if LIVE_VIEW:
        flow.request.path = "/"
        flow.request.headers = http.Headers()
        if flow.request.raw_content is not None:
            flow.request.raw_content = b""


def _after_sent(flow):
    """Once the request has gone upstream, the flow the live view keeps
    gets the guest's placeholders back where vibedom put real credentials
    (any other real value redacted), loses a large body, and only then is
    marked: the view lists marked flows only, so it never shows (lists,
    dumps or broadcasts) the request as sent with the real keys."""
    guest = _unsent.pop(flow.id, None)
    if guest is None:
        return
    req = flow.request
    fields = []
    for k, v in req.headers.fields:
        if _redact(v) != v:
            orig = guest.get(k.lower())
            v = orig if orig is not None and _redact(orig) == orig else _redact(v)
        fields.append((_redact_name(k), v))
    req.headers = http.Headers(fields)
    req.path = _redact_s(req.path)
    rc = req.raw_content
    if rc:
        req.raw_content = _redact(rc) if len(rc) <= VIEW_BODY_MAX else b""
    flow.marked = SENT_MARK


def _authorized(handler):
    """Whether a request to the web UI carries the session's token (the
    ?token= of the printed URL, which sets a cookie, or that cookie)."""
    if not VIEW_TOKEN:
        return False
    name = "vibedom_view_%d" % ctx.options.web_port
    arg = handler.get_query_argument("token", "")
    if arg and hmac.compare_digest(arg, VIEW_TOKEN):
        if handler.get_cookie(name) != VIEW_TOKEN:
            handler.set_cookie(name, VIEW_TOKEN, httponly=True, samesite="Strict")
        return True
    return hmac.compare_digest(handler.get_cookie(name, ""), VIEW_TOKEN)


def _guard_web_ui():
    """Makes mitmweb's web UI read-only and private: a request without the
    session's token is refused, every request other than GET or HEAD is
    refused (replay, duplicate, edit, resume, kill, clear, upload, options,
    commands), the options it shows hide the session's secrets, what it
    shows of a flow and of the event log holds no real credential, and the
    intercept addon never holds a flow (an edited flow would go upstream
    unchecked)."""
    import tornado.web
    from mitmproxy import optmanager
    from mitmproxy.tools.web import app

    def guarded(orig):
        def prepare(self):
            if orig is not None:
                r = orig(self)  # mitmweb 11.1+: its own password check
                if r is not None:
                    return r
            if not _authorized(self):
                raise tornado.web.HTTPError(403, reason="vibedom: open the URL vibedom printed (it carries the session's token)")
            if self.request.method not in ("GET", "HEAD") and not _TEST_OPEN_UI:
                raise tornado.web.HTTPError(403, reason="vibedom: the live view is read-only")

        return prepare

    def options_get(self):
        d = optmanager.dump_dicts(self.master.options)
        for k in _SECRET_OPTIONS:
            if k in d:
                d[k]["value"] = "(hidden by vibedom)"
        self.write(d)

    app.RequestHandler.prepare = guarded(getattr(app.RequestHandler, "prepare", None))
    for name in ("ClientConnection", "WebSocketEventBroadcaster"):
        cls = getattr(app, name, None)
        if cls is not None and "prepare" not in cls.__dict__:
            cls.prepare = guarded(getattr(cls, "prepare", None))
        elif cls is not None:
            cls.prepare = guarded(cls.__dict__["prepare"])
    app.Options.get = options_get

    to_json = app.flow_to_json

    def flow_to_json(f):
        return _redact_json(to_json(f))

    app.flow_to_json = flow_to_json


def _redact_json(o):
    if isinstance(o, str):
        return _redact_s(o)
    if isinstance(o, bytes):
        return _redact(o)
    if isinstance(o, list):
        return [_redact_json(x) for x in o]
    if isinstance(o, tuple):
        return tuple(_redact_json(x) for x in o)
    if isinstance(o, dict):
        return {_redact_json(k): _redact_json(v) for k, v in o.items()}
    return o


_WS_PAYLOAD = re.compile(r"\(payload: .*\)\s*$", re.S)


def _filter_event_log():
    """mitmweb's event log (GET /events, the UI's WebSocket) gets no real
    credential and no WebSocket control frame payload."""
    ev = getattr(ctx.master, "events", None)
    if ev is None or not hasattr(ev, "add_log"):
        raise RuntimeError("no event log to filter")
    orig = ev.add_log

    def add_log(entry, *a, **kw):
        msg = getattr(entry, "msg", None)
        if isinstance(msg, str):
            new = _redact_s(_WS_PAYLOAD.sub("(payload hidden by vibedom)", msg))
            if new != msg:
                try:
                    entry.msg = new
                except Exception:
                    entry = type(entry)(new, entry.level)
        return orig(entry, *a, **kw)

    ev.add_log = add_log


def _scrub_ws_control_frames():
    """WebSocket pings, pongs and close reasons pass no addon hook: the
    connection's sender replaces real credentials in them."""
    import wsproto.events as we
    from mitmproxy.proxy.layers import websocket as wsl

    orig = wsl.WebsocketConnection.send2

    def send2(self, event):
        if _secrets:
            if isinstance(event, (we.Ping, we.Pong)):
                p = bytes(event.payload)
                q = _redact_short(p)
                if q != p:
                    event = type(event)(payload=q)
            elif isinstance(event, we.CloseConnection) and event.reason:
                r = _redact_short(event.reason.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")
                if r != event.reason:
                    event = we.CloseConnection(code=event.code, reason=r)
        return orig(self, event)

    wsl.WebsocketConnection.send2 = send2


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
        try:
            _scrub_ws_control_frames()
        except Exception as e:
            ctx.log.error("vibedom: cannot scrub WebSocket control frames: %s" % e)
            ctx.master.shutdown()
        try:
            _swallow_informational()
        except Exception as e:
            # Not a leak (1xx headers are scrubbed like any other), only a
            # request that would stall on a 103.
            ctx.log.warn("vibedom: cannot drop HTTP/1 informational responses: %s" % e)
        try:
            _relay_http1_trailers()
        except Exception as e:
            # Not a leak (trailers are scrubbed in the hooks), only an
            # HTTP/1 message with trailers that stalls.
            ctx.log.warn("vibedom: cannot relay HTTP/1 trailers: %s" % e)
        # Any web UI is private and read-only, whether or not vibedom said
        # it runs one.
        if LIVE_VIEW or hasattr(ctx.master, "app"):
            try:
                _guard_web_ui()
                _filter_event_log()
                _no_intercept()
            except Exception as e:
                # A UI vibedom cannot guard does not run.
                ctx.log.error("vibedom: cannot make the web UI private and read-only: %s" % e)
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

    async def next_layer(self, nextlayer):
        # Bytes mitmdump would relay raw (neither TLS nor HTTP, or not
        # HTTP inside TLS) never pass the DLP: vibedom allows that only on
        # ports other than 80 and 443, as the Go engine does. Refused, the
        # connection gets an HTTP layer (which answers 400 to anything not
        # HTTP) and vibedom closes it.
        from mitmproxy.proxy import layers

        if nextlayer.layer is None:
            # This addon runs before mitmproxy's own choice: make it now.
            nl = ctx.master.addons.get("nextlayer")
            if nl is not None:
                nl.next_layer(nextlayer)
        lay = nextlayer.layer
        if not isinstance(lay, layers.TCPLayer):
            return
        addr = nextlayer.context.server.address
        port = addr[1] if addr else 0
        try:
            ans = await _pool.call({"op": "raw", "peer": _peer(nextlayer.context.client), "dport": port})
            ok = ans.get("action") == "allow"
        except Exception:
            ok = False
        if not ok or port in (80, 443):
            from mitmproxy.proxy.layers.http import HTTPMode

            nextlayer.layer = layers.HttpLayer(nextlayer.context, HTTPMode.transparent)

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

    async def requestheaders(self, flow):
        # A replay (or a replayed duplicate) from the web UI never goes out.
        if flow.is_replay:
            flow.kill()
            return
        # The DLP reads the request whole: never stream it past the check.
        flow.request.stream = False
        h = flow.request.headers
        try:
            n = int(h.get("content-length", "0"))
            too_big = n > BODY_LIMIT or n < 0
        except ValueError:
            n, too_big = -1, True
        if too_big:
            _forget_request(flow)
            flow.kill()
            return
        # mitmdump is about to buffer the body: vibedom charges it to the
        # session's memory budget first, or the request is refused.
        unknown = "content-length" not in h and (
            "transfer-encoding" in h
            or (flow.request.http_version.startswith("HTTP/2") and flow.request.method.upper() not in ("GET", "HEAD", "OPTIONS")))
        if n == 0 and not unknown:
            return
        try:
            ans = await _pool.call({"op": "reserve", "peer": _peer(flow.client_conn), "id": flow.id,
                                    "method": flow.request.method, "len": -1 if unknown else n})
            ok = ans.get("action") == "allow"
        except Exception:
            ok = False
        if not ok:
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
        raw = req.raw_content or b""
        if len(raw) > BODY_LIMIT:
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
            "trailers": _fields(req.trailers) if req.trailers else [],
            "replay": bool(flow.is_replay),
        }, body=raw)
        if ans.get("action") == "answer":
            # vibedom answers this request itself; nothing is forwarded.
            hdrs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in ans.get("headers") or []]
            hdrs.append((b"X-Vibedom", b"answered"))
            flow.response = http.Response.make(int(ans.get("status") or 200), base64.b64decode(ans.get("body") or ""),
                                               http.Headers(hdrs))
            flow.metadata["vibedom_refused"] = True
            _forget_request(flow)
            return
        if ans.get("action") != "allow":
            _refuse(flow, int(ans.get("status") or 403), ans.get("reason") or "refused", ans.get("refusal"))
            return
        _learn([base64.b64decode(v) for v in ans.get("scrub") or []], base64.b64decode(ans.get("scrub_with") or ""))
        guest = {k.lower(): v for k, v in req.headers.fields}
        method, path = ans["method"], ans["path"]
        headers = http.Headers([(k.encode("latin-1"), v.encode("latin-1")) for k, v in ans.get("headers") or []])
        body = ans.get("_body") or b""
        req.method, req.path, req.headers, req.raw_content = method, path, headers, body
        # Trailers as vibedom scrubbed them (mitmdump sends them after this
        # hook), lower-case for an HTTP/2 upstream's sake.
        req.trailers = _headers(ans.get("trailers"), True) if ans.get("trailers") else None
        if LIVE_VIEW:
            _unsent[flow.id] = guest
        else:
            flow.marked = SENT_MARK

    async def responseheaders(self, flow):
        # The request has gone out: the live view's copy loses the real
        # credentials. Stream the response, counting the bytes, with the
        # real credentials a provider might echo back scrubbed by vibedom
        # in the headers (names and values, every form the DLP knows) and,
        # as it streams, in the body: a provider's response through
        # vibedom's scrubber, any other with the literal values replaced.
        _after_sent(flow)
        n = [0]
        repl = None
        if _secrets and not flow.metadata.get("vibedom_refused"):
            try:
                ans = await _pool.call({"op": "rhead", "id": flow.id, "status": flow.response.status_code,
                                        "method": flow.request.method, "headers": _fields(flow.response.headers)})
                if ans.get("action") != "allow":
                    raise RuntimeError(ans.get("reason") or "refused")
                flow.response.headers = _headers(ans.get("headers"), flow.response.http_version.startswith("HTTP/2"))
                if ans.get("stream"):
                    flow.metadata["vibedom_stream"] = _BodyStream(flow.id)
            except Exception as e:
                flow.metadata["vibedom_failed"] = "the response scrubber refused the response (%s)" % e
                flow.kill()
                return
            bs = flow.metadata.get("vibedom_stream")
            if bs is not None:
                def repl(chunk):
                    out = bs.feed(chunk, chunk == b"")
                    if bs.failed and flow.killable:
                        # The rest is not passed; the response ends in an
                        # error, not as if it were whole.
                        flow.metadata["vibedom_failed"] = bs.failed
                        flow.kill()
                    # Never an empty chunk: on HTTP/1 it would end the
                    # chunked body.
                    return [out] if out else []
            else:
                repl = _replacer()
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
        _after_sent(flow)
        # Trailers are sent after this hook.
        if _secrets and flow.response.trailers:
            try:
                ans = await _pool.call({"op": "rtrail", "id": flow.id, "headers": _fields(flow.response.trailers)})
                h2 = flow.response.http_version.startswith("HTTP/2")
                flow.response.trailers = _headers(ans.get("headers"), h2) if ans.get("action") == "allow" else None
            except Exception:
                flow.response.trailers = None
        failed = flow.metadata.get("vibedom_failed")
        if failed:
            if flow.killable:
                flow.kill()
            await self._done(flow, failed)
            return
        if flow.response.status_code == 101:
            try:
                await _pool.call({"op": "status", "id": flow.id, "status": 101}, reply=False)
            except Exception:
                pass
            return
        if flow.metadata.get("vibedom_refused"):
            # vibedom recorded the refusal; this only frees what the
            # request held.
            try:
                await _pool.call({"op": "release", "id": flow.id}, reply=False)
            except Exception:
                pass
            return
        await self._done(flow, "")

    async def error(self, flow):
        _after_sent(flow)
        err = flow.metadata.get("vibedom_failed") or (str(flow.error) if flow.error else "error")
        await self._done(flow, err)

    async def websocket_message(self, flow):
        msg = flow.websocket.messages[-1]
        if msg.injected:
            # Sent from the web UI, not by the guest: never relayed.
            msg.content = b""
            msg.drop()
            return
        if not msg.from_client:
            # A real credential echoed back by the server, in any form the
            # DLP knows: vibedom scrubs it as the Go engine does each frame.
            if _secrets:
                try:
                    ans = await _pool.call({"op": "wsin", "id": flow.id,
                                            "body": base64.b64encode(msg.content).decode()})
                    msg.content = base64.b64decode(ans.get("body") or "")
                except Exception:
                    msg.content = b""
                    msg.drop()
                    flow.kill()
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
        # The close reason as received stays on the flow (the live view).
        ws = flow.websocket
        if _secrets and ws is not None and ws.close_reason:
            ws.close_reason = _redact_s(ws.close_reason)
        await self._done(flow, "")

    async def _done(self, flow, err):
        _unsent.pop(flow.id, None)
        bs = flow.metadata.pop("vibedom_stream", None)
        if bs is not None:
            bs.close()
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
