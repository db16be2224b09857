#!/usr/bin/env python3
"""Checks an export-attention gallery (DIR/index.html) in headless Chromium over the DevTools protocol, stdlib only.

Passes when: no console errors, uncaught exceptions or failed loads; every expected image card is shown and every
<img> decodes; a real mouse click (Input.dispatchMouseEvent) on a layer x head cell opens the large view of exactly
that map (its pixels are compared with colours computed here from the page's embedded data) at several times the
cell's size; Escape closes it; a click on an overlay thumbnail shows that picture; the faithfulness table, when there
is one, has a row per method and sorts on a click of a heading. Saves two screenshots.
Exit status: 0 pass, 1 fail (reasons printed), 2 Chromium could not be started or driven.
"""
import argparse
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time


class WebSocket:
    """A minimal RFC 6455 client: text frames out (masked), text/continuation/ping/close in."""

    def __init__(self, host, port, path, timeout=60):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            response += chunk
        head, self.buffer = response.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError("websocket handshake refused: " + head.decode(errors="replace"))

    def _read(self, count):
        while len(self.buffer) < count:
            chunk = self.sock.recv(max(65536, count - len(self.buffer)))
            if not chunk:
                raise ConnectionError("websocket closed by Chromium")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def send(self, text):
        payload = text.encode()
        header = bytes([0x81])
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        elif len(payload) < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def recv(self):
        message = b""
        while True:
            first, second = self._read(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else None
            payload = self._read(length)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:
                raise ConnectionError("websocket closed by Chromium")
            if opcode == 0x9:  # ping: answer with a pong carrying the same payload
                self.sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
                continue
            message += payload
            if first & 0x80:
                return message.decode()


class DevTools:
    """DevTools protocol over one browser websocket, with flattened target sessions."""

    def __init__(self, ws):
        self.ws, self.next_id, self.events = ws, 1, []

    def call(self, method, params=None, session=None, timeout=60):
        message_id = self.next_id
        self.next_id += 1
        message = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.time() + timeout
        while time.time() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"{method}: no answer in {timeout} s")

    def wait_event(self, name, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for event in self.events:
                if event.get("method") == name:
                    return event
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(f"no {name} event in {timeout} s")


def launch(chromium, profile):
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900",
            f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port_file = os.path.join(profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{chromium} exited with {process.returncode}: "
                               + process.stderr.read().decode(errors="replace")[-2000:])
        if os.path.exists(port_file):
            lines = open(port_file).read().split()
            if len(lines) >= 2:
                return process, int(lines[0]), lines[1]
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{chromium} wrote no {port_file} within 60 s")


def page_data(html_path):
    text = open(html_path, encoding="utf-8").read()
    found = re.search(r'<script id="export-data" type="application/json">(.*?)</script>', text, re.S)
    if not found:
        raise ValueError(f"{html_path}: no embedded export data")
    return json.loads(found.group(1))


def expected_pixels(data, image, row, col):
    """RGBA bytes the large canvas must hold: one pixel per patch, colour = table[round(clamp(v) * 255)]."""
    table = [tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)) for h in data["colormap"]]
    out = []
    for v in data["images"][image]["maps"][row][col]:
        index = int(min(1.0, max(0.0, v)) * 255 + 0.5)  # JavaScript's Math.round for non-negative values
        out.extend(table[index] + (255,))
    return out


def check(args):
    failures = []
    data = page_data(args.html)
    profile = tempfile.mkdtemp(prefix="vit-chromium-")
    process = None
    try:
        try:
            process, port, path = launch(args.chromium, profile)
            tools = DevTools(WebSocket("127.0.0.1", port, path))
            target = tools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = tools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        except Exception as error:  # noqa: BLE001 - any failure here means Chromium could not be driven
            print(f"cannot drive Chromium: {error}")
            return 2

        def call(method, params=None):
            return tools.call(method, params, session)

        def evaluate(expression):
            result = call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
            if "exceptionDetails" in result:
                raise RuntimeError(f"evaluating {expression[:80]}...: {result['exceptionDetails']}")
            return result["result"].get("value")

        for domain in ("Runtime", "Log", "Page"):
            call(f"{domain}.enable")
        call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1,
                                                    "mobile": False})
        url = "file://" + os.path.abspath(args.html)
        call("Page.navigate", {"url": url})
        tools.wait_event("Page.loadEventFired", timeout=60)
        ready = evaluate("new Promise(done => { const t0 = Date.now(); (function poll() {"
                         " if (document.body && document.body.dataset.ready === 'true') done(true);"
                         " else if (Date.now() - t0 > 20000) done(false); else setTimeout(poll, 50); })(); })")
        if not ready:
            failures.append("the page never finished rendering (body[data-ready] not set)")

        # Every image card, and every picture decoded (lazy ones are asked to load now).
        names = evaluate("[...document.querySelectorAll('section.card[data-name]')].map(s => s.dataset.name)")
        if sorted(names) != sorted(args.expect):
            failures.append(f"image cards {names}, expected {args.expect}")
        broken = evaluate("""Promise.all([...document.images].map(img => { img.loading = 'eager';
              if (!img.getAttribute('src')) return Promise.resolve(null);
              return (img.complete ? Promise.resolve() : new Promise(done => { img.onload = img.onerror = done; }))
                .then(() => img.naturalWidth > 0 ? null : img.getAttribute('src')); }))
              .then(list => list.filter(x => x))""")
        if broken:
            failures.append(f"pictures that did not load: {broken}")
        cells = evaluate("document.querySelectorAll('.cell').length")
        expected_cells = sum(len(i["layers"]) * len(i["heads"]) for i in data["images"])
        if cells != expected_cells:
            failures.append(f"{cells} grid cells on the page, expected {expected_cells}")
        shot = call("Page.captureScreenshot", {"format": "png"})["data"]
        open(args.screenshot, "wb").write(base64.b64decode(shot))

        # A real click on the last cell of the first card: the browser's input pipeline, not element.click().
        image, row = 0, len(data["images"][0]["layers"]) - 1
        col = len(data["images"][0]["heads"]) - 1
        selector = f'.cell[data-image="{image}"][data-row="{row}"][data-col="{col}"]'
        rect = evaluate(f"""(() => {{ const c = document.querySelector('{selector}');
              c.scrollIntoView({{block: 'center'}}); const r = c.getBoundingClientRect();
              const map = c.querySelector('canvas').getBoundingClientRect();
              return {{x: r.left + r.width / 2, y: r.top + r.height / 2, w: map.width}}; }})()""")
        hit = evaluate(f"document.elementFromPoint({rect['x']}, {rect['y']}).closest('.cell') === "
                       f"document.querySelector('{selector}')")
        if not hit:
            failures.append("the chosen cell is covered by another element at its centre")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            params = {"type": kind, "x": rect["x"], "y": rect["y"]}
            if kind != "mouseMoved":
                params.update({"button": "left", "buttons": 1 if kind == "mousePressed" else 0, "clickCount": 1})
            call("Input.dispatchMouseEvent", params)
        view = evaluate("""(() => { const box = document.getElementById('lightbox');
              const canvas = document.getElementById('lb-map'); const r = canvas.getBoundingClientRect();
              const pixels = canvas.width ? Array.from(canvas.getContext('2d')
                  .getImageData(0, 0, canvas.width, canvas.height).data) : [];
              return {open: !box.hidden && getComputedStyle(box).display !== 'none', kind: box.dataset.kind,
                      image: box.dataset.image, layer: box.dataset.layer, head: box.dataset.head,
                      width: r.width, height: r.height, pixels,
                      caption: document.getElementById('lb-caption').textContent};
            })()""")
        entry = data["images"][image]
        if not view["open"]:
            failures.append("clicking a grid cell did not open the large view")
        else:
            want = (str(image), str(entry["layers"][row]), str(entry["heads"][col]))
            if (view["image"], view["layer"], view["head"]) != want or view["kind"] != "map":
                failures.append(f"large view shows {view['kind']} image {view['image']} layer {view['layer']} "
                                f"head {view['head']}, expected map of image/layer/head {want}")
            if view["pixels"] != expected_pixels(data, image, row, col):
                failures.append("the large view's pixels are not the clicked cell's map")
            others = [expected_pixels(data, image, r, c) for r in range(len(entry["layers"]))
                      for c in range(len(entry["heads"])) if (r, c) != (row, col)]
            if others and all(o == view["pixels"] for o in others):
                print("note: every map of this image looks the same, the pixel comparison cannot tell cells apart")
            if view["width"] < 3 * rect["w"]:
                failures.append(f"the large map is {view['width']:.0f} px wide, not enlarged from the cell's "
                                f"{rect['w']:.0f} px")
        shot = call("Page.captureScreenshot", {"format": "png"})["data"]
        open(args.zoom_screenshot, "wb").write(base64.b64decode(shot))

        for kind in ("keyDown", "keyUp"):
            call("Input.dispatchKeyEvent", {"type": kind, "key": "Escape", "code": "Escape",
                                            "windowsVirtualKeyCode": 27})
        if not evaluate("document.getElementById('lightbox').hidden"):
            failures.append("Escape did not close the large view")

        # An overlay thumbnail opens that picture.
        thumb = evaluate("""(() => { const t = document.querySelector('.thumb'); if (!t) return null;
              t.scrollIntoView({block: 'center'}); const r = t.getBoundingClientRect();
              return {x: r.left + r.width / 2, y: r.top + r.height / 2, src: t.dataset.src}; })()""")
        if thumb:
            for kind in ("mousePressed", "mouseReleased"):
                call("Input.dispatchMouseEvent", {"type": kind, "x": thumb["x"], "y": thumb["y"], "button": "left",
                                                  "buttons": 1 if kind == "mousePressed" else 0, "clickCount": 1})
            picture = evaluate("""new Promise(done => { const img = document.getElementById('lb-picture');
                  const report = () => done({open: !document.getElementById('lightbox').hidden,
                                             src: img.getAttribute('src'), width: img.naturalWidth});
                  if (img.complete) report(); else img.onload = img.onerror = report; })""")
            if not picture["open"] or picture["src"] != thumb["src"] or picture["width"] <= 0:
                failures.append(f"clicking a thumbnail showed {picture}, expected {thumb['src']}")

        # The faithfulness table (when the export measured it): one row per method, and a real click on a column
        # heading sorts the rows by that column, a second click the other way.
        table_rows = None
        if data.get("faithfulness"):
            for kind in ("keyDown", "keyUp"):  # close the picture the thumbnail opened
                call("Input.dispatchKeyEvent", {"type": kind, "key": "Escape", "code": "Escape",
                                                "windowsVirtualKeyCode": 27})
            want_rows = sorted(row["method"] for row in data["faithfulness"]["table"])
            table_rows = evaluate("""Array.from(document.querySelectorAll('#faithfulness table.faith-table tbody tr'))
                  .map(tr => tr.dataset.method)""")
            if sorted(table_rows or []) != want_rows:
                failures.append(f"faithfulness table rows {table_rows}, expected {want_rows}")
            for click, direction in ((1, "ascending"), (2, "descending")):
                heading = evaluate("""(() => { const th = document.querySelector('#faithfulness th[data-col="1"]');
                      th.scrollIntoView({block: 'center'}); const r = th.getBoundingClientRect();
                      return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()""")
                for kind in ("mousePressed", "mouseReleased"):
                    call("Input.dispatchMouseEvent", {"type": kind, "x": heading["x"], "y": heading["y"],
                                                      "button": "left", "buttons": 1 if kind == "mousePressed" else 0,
                                                      "clickCount": 1})
                values = evaluate("""Array.from(document.querySelectorAll('#faithfulness tbody tr'))
                      .map(tr => Number(tr.cells[2].dataset.value))""")
                want = sorted(values, reverse=direction == "descending")
                if values != want:
                    failures.append(f"after {click} click(s) on the insertion heading the rows are {values}, "
                                    f"not {direction}")

        time.sleep(0.2)  # let late console messages arrive
        try:
            call("Runtime.evaluate", {"expression": "1"})
        except Exception:  # noqa: BLE001
            pass
        for event in tools.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                failures.append("uncaught exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                failures.append("console error: " + json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                failures.append(f"log error ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
        print(json.dumps({"cards": names, "cells": cells, "clicked": {"image": image, "row": row, "col": col},
                          "faithfulness_rows": table_rows,
                          "screenshots": [args.screenshot, args.zoom_screenshot]}))
    finally:
        if process is not None:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("PASS")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", help="the gallery page (DIR/index.html)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--expect", nargs="*", default=[], help="image card names that must be shown")
    parser.add_argument("--screenshot", required=True, help="PNG of the page as opened")
    parser.add_argument("--zoom-screenshot", required=True, help="PNG with the large view open")
    return check(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
