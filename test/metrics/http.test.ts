import { get } from "node:http";
import { connect, type Socket } from "node:net";
import { Counter, Registry } from "prom-client";
import { afterEach, describe, expect, it } from "vitest";
import {
  KEEP_ALIVE_MS,
  MAX_CONNECTIONS,
  MAX_HEADER_BYTES,
  MetricsAddressError,
  REQUEST_TIMEOUT_MS,
  MetricsServer,
  parseMetricsAddress,
} from "../../controller/metrics/http.ts";
import { createRegistry } from "../../controller/metrics/registry.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/** The scrape endpoint treats its peer as hostile: one path, one method, no body, bounded headers. */

let server: MetricsServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

async function serve(registry: Registry = createRegistry("daemon")): Promise<string> {
  server = await MetricsServer.start(registry, { host: "127.0.0.1", port: 0 });
  return `http://${server.address}`;
}

/** Sends raw bytes and returns what came back before the server closed or answered. */
function raw(address: string, bytes: string): Promise<string> {
  const [host, port] = address.replace("http://", "").split(":");
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), host!, () => socket.end(bytes));
    let answer = "";
    socket.on("data", (chunk) => (answer += chunk.toString()));
    socket.on("close", () => resolve(answer));
    socket.on("error", reject);
  });
}

/** Writes `request` on a raw connection to `base` and resolves with all it heard once the server closed it. */
function exchange(base: string, request: string): Promise<string> {
  const [host, port] = base.replace("http://", "").split(":");
  return new Promise<string>((resolve, reject) => {
    const socket = connect(Number(port), host!, () => socket.write(request));
    let text = "";
    socket.on("data", (chunk) => (text += chunk.toString()));
    socket.on("close", () => resolve(text));
    socket.on("error", reject);
  });
}

describe("the metrics listener", () => {
  it("serves the registry in Prometheus text format at GET /metrics", async () => {
    const registry = createRegistry("daemon");
    new Counter({ name: "monkeytree_test_things_total", help: "things", registers: [registry] }).inc(3);
    const base = await serve(registry);
    const response = await fetch(`${base}/metrics`);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await response.text();
    expect(text).toMatch(/^monkeytree_test_things_total 3$/m);
    expect(text).toMatch(/^monkeytree_build_info\{.*role="daemon"\} 1$/m);
  });

  it("answers 404 for other paths, 405 for other methods, 400 for a body", async () => {
    const base = await serve();
    expect((await fetch(`${base}/`)).status).toBe(404);
    expect((await fetch(`${base}/metrics/x`)).status).toBe(404);
    const post = await fetch(`${base}/metrics`, { method: "POST", body: "x" });
    expect(post.status).toBe(405);
    expect(post.headers.get("allow")).toBe("GET");
    expect((await fetch(`${base}/metrics`, { method: "DELETE" })).status).toBe(405);
    const withBody = await raw(base, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    expect(withBody).toMatch(/^HTTP\/1\.1 400 /);
    const chunked = await raw(base, "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    expect(chunked).toMatch(/^HTTP\/1\.1 400 /);
  });

  it("refuses headers past its bound without reading them", async () => {
    const base = await serve();
    const answer = await raw(base, `GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: ${"a".repeat(MAX_HEADER_BYTES * 2)}\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 431 /);
  });

  it("closes a connection that does not finish its request in time", async () => {
    const base = await serve();
    const started = Date.now();
    // Headers that never end: a slow peer holding the connection.
    const answer = await exchange(base, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(Date.now() - started).toBeGreaterThanOrEqual(REQUEST_TIMEOUT_MS - 100);
  }, 30_000);

  it(
    `keeps serving scrapes while idle, keep-alive and slow-loris peers hold all ${MAX_CONNECTIONS} connections`,
    async () => {
      const base = await serve();
      const [host, port] = base.replace("http://", "").split(":");
      const scrape = () =>
        new Promise<number>((resolve, reject) => {
          // A connection of its own each time, as a scraper after the keep-alive closed.
          get({ host, port: Number(port), path: "/metrics", agent: false }, (response) => {
            response.resume();
            response.on("end", () => resolve(response.statusCode ?? 0));
          }).on("error", reject);
        });
      // Each peer comes back as soon as it is closed, so the slots stay taken.
      const kinds = { idle: "", "keep-alive": "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "slow-loris": "GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a" };
      let attacking = true;
      const peers: Socket[] = [];
      const attack = (bytes: string) => {
        if (!attacking) return;
        const socket = connect(Number(port), host!, () => socket.write(bytes));
        socket.on("error", () => undefined).on("close", () => setImmediate(() => attack(bytes)));
        peers.push(socket);
      };
      try {
        for (const bytes of Object.values(kinds)) for (let i = 0; i < MAX_CONNECTIONS; i++) attack(bytes);
        await expect.poll(() => server!.connections, patiently).toBe(MAX_CONNECTIONS);
        const statuses: number[] = [];
        for (let i = 0; i < 30; i++) {
          statuses.push(await scrape());
          expect(server!.connections).toBeLessThanOrEqual(MAX_CONNECTIONS);
        }
        expect(statuses).toEqual(Array.from({ length: 30 }, () => 200));
      } finally {
        attacking = false;
        for (const socket of peers) socket.destroy();
      }
    },
    SAFETY_NET_MS,
  );

  it(
    "closes an idle keep-alive connection once its answer is sent",
    async () => {
      const base = await serve();
      // Asks for keep-alive and never closes its side: the server must.
      const answer = await exchange(base, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
      expect(answer).toMatch(/^HTTP\/1\.1 200 /);
      expect(answer).toContain(`Keep-Alive: timeout=${KEEP_ALIVE_MS / 1000}`);
      await expect.poll(() => server!.connections, patiently).toBe(0);
    },
    SAFETY_NET_MS,
  );

  it("takes PORT (loopback) or HOST:PORT, and names the flag for anything else", () => {
    expect(parseMetricsAddress("9100")).toEqual({ host: "127.0.0.1", port: 9100 });
    expect(parseMetricsAddress("0.0.0.0:9100")).toEqual({ host: "0.0.0.0", port: 9100 });
    expect(parseMetricsAddress("[::1]:0")).toEqual({ host: "::1", port: 0 });
    for (const bad of ["", "x", "host:", "1:2:3", "70000", "h:99999"]) expect(() => parseMetricsAddress(bad)).toThrow(MetricsAddressError);
    expect(() => parseMetricsAddress("x")).toThrow('--metrics must be PORT or HOST:PORT with a port in 0..65535, got "x"');
  });
});
