import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import type { Registry } from "prom-client";

/**
 * The Prometheus scrape endpoint of a controller or daemon (`--metrics ADDR`). Whoever reaches
 * it is assumed hostile: it answers `GET /metrics` only (404 for another path, 405 for another
 * method, 400 for a request that carries a body), and bounds what a peer can make it hold:
 * header size, time to send the request, open connections and idle keep-alive. Connections
 * that hold slots without a request being answered (idle, or sending headers slowly) cannot
 * keep a scraper out: a connection past the bound evicts the oldest of them.
 */

/** Header bytes a request may send; a scraper sends a few hundred. */
export const MAX_HEADER_BYTES = 4096;
/** Time a peer has to send its whole request, and its headers. */
export const REQUEST_TIMEOUT_MS = 5_000;
/**
 * Connections held at once. A connection past them evicts the oldest one that is not being
 * answered, and is closed on arrival only when every slot is answering a request.
 */
export const MAX_CONNECTIONS = 16;
/** An idle keep-alive connection is closed after this long: a scraper asks every few seconds at most. */
export const KEEP_ALIVE_MS = 1_000;

/**
 * The open connections, oldest first, and those answering a request now: the rest (idle,
 * or still sending their request) are what a new connection may evict when all are taken.
 */
class ConnectionSlots {
  private readonly open = new Set<Socket>();
  private readonly answering = new Set<Socket>();

  get size(): number {
    return this.open.size;
  }

  /** Takes a slot for `socket`, evicting the oldest connection not answering when all are taken. */
  admit(socket: Socket): void {
    if (this.open.size >= MAX_CONNECTIONS) {
      const evictable = [...this.open].find((s) => !this.answering.has(s));
      if (!evictable) {
        socket.destroy();
        return;
      }
      this.release(evictable);
      evictable.destroy();
    }
    this.open.add(socket);
    socket.once("close", () => this.release(socket));
  }

  /** Marks `socket` as answering until `response` is done: it is not evicted meanwhile. */
  answer(socket: Socket, response: ServerResponse): void {
    if (!this.open.has(socket)) return;
    this.answering.add(socket);
    response.once("close", () => this.answering.delete(socket));
  }

  private release(socket: Socket): void {
    this.open.delete(socket);
    this.answering.delete(socket);
  }
}

export interface MetricsAddress {
  readonly host: string;
  readonly port: number;
}

/** Raised for a `--metrics` value that is not `PORT` or `HOST:PORT`; the CLI reports it as a usage error. */
export class MetricsAddressError extends Error {
  override readonly name = "MetricsAddressError";
}

/**
 * `PORT` (on loopback) or `HOST:PORT`, with `[v6]:PORT` for IPv6; port 0 takes any free one.
 * Loopback is the default because the metrics name jobs' placement and migrations.
 */
export function parseMetricsAddress(raw: string): MetricsAddress {
  const match = /^(?:(\[[^\]]+\]|[^:[\]]+):)?(\d{1,5})$/.exec(raw);
  const port = Number(match?.[2]);
  if (!match || port > 65535) throw new MetricsAddressError(`--metrics must be PORT or HOST:PORT with a port in 0..65535, got "${raw}"`);
  return { host: (match[1] ?? "127.0.0.1").replace(/^\[(.*)\]$/, "$1"), port };
}

export const isLoopbackHost = (host: string): boolean => /^(127\.[\d.]+|localhost|::1)$/.test(host);

export class MetricsServer {
  private constructor(
    private readonly server: Server,
    /** Where it listens, as `HOST:PORT` (the port chosen when 0 was asked for). */
    readonly address: string,
    private readonly slots: ConnectionSlots,
  ) {}

  static async start(registry: Registry, at: MetricsAddress): Promise<MetricsServer> {
    const slots = new ConnectionSlots();
    const server = createServer(
      // Node checks the request timeouts every connectionsCheckingInterval (30 s by default).
      {
        maxHeaderSize: MAX_HEADER_BYTES,
        requestTimeout: REQUEST_TIMEOUT_MS,
        headersTimeout: REQUEST_TIMEOUT_MS,
        keepAliveTimeout: KEEP_ALIVE_MS,
        connectionsCheckingInterval: 1_000,
      },
      (request, response) => {
        slots.answer(request.socket, response);
        void answer(registry, request, response);
      },
    );
    // Not server.maxConnections, which refuses the newcomer: a slot held by an idle or slow
    // peer goes to the newcomer instead (`ConnectionSlots`).
    server.on("connection", (socket: Socket) => slots.admit(socket));
    server.maxRequestsPerSocket = 100;
    await new Promise<void>((resolve, reject) => {
      server.once("error", (error) => reject(new Error(`cannot serve metrics on ${at.host}:${at.port}: ${error.message}; pick another --metrics address`)));
      server.listen(at.port, at.host, () => resolve());
    });
    const bound = server.address() as AddressInfo;
    const host = bound.family === "IPv6" ? `[${bound.address}]` : bound.address;
    return new MetricsServer(server, `${host}:${bound.port}`, slots);
  }

  /** Connections open now; at most `MAX_CONNECTIONS`. */
  get connections(): number {
    return this.slots.size;
  }

  /** Stops listening and drops open connections. */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    await closed;
  }
}

async function answer(registry: Registry, request: IncomingMessage, response: ServerResponse): Promise<void> {
  const reply = (status: number, text: string, headers: Record<string, string> = {}) => {
    response.writeHead(status, { "Content-Type": "text/plain; charset=utf-8", ...headers });
    response.end(`${text}\n`);
  };
  const path = (request.url ?? "").split("?")[0];
  if (path !== "/metrics") return reply(404, "not found: metrics are at GET /metrics");
  if (request.method !== "GET") return reply(405, "method not allowed: use GET", { Allow: "GET" });
  // A body would be held unread; a scrape never sends one.
  if (request.headers["transfer-encoding"] !== undefined || Number(request.headers["content-length"] ?? 0) !== 0) {
    return reply(400, "a metrics request has no body", { Connection: "close" });
  }
  try {
    const text = await registry.metrics();
    response.writeHead(200, { "Content-Type": registry.contentType });
    response.end(text);
  } catch (error) {
    reply(500, `collecting metrics failed: ${error instanceof Error ? error.message : String(error)}`);
  }
}
