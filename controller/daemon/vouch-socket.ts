import { chmodSync, lstatSync, mkdirSync, rmSync } from "node:fs";
import { connect, createServer, type Server, type Socket } from "node:net";
import { dirname } from "node:path";
import type { Logger } from "../../sdk/contract/log.ts";
import { LocalVouchRequestSchema, MAX_LOCAL_VOUCH_BYTES, type LocalVouchReply } from "../../sdk/contract/protocol/vouch.ts";

/**
 * The daemon's local socket, where its host's launchers ask it to vouch for them: any local
 * process may ask (the socket is 0666), no remote one can. Each connection gets one request
 * line, bounded in size and time, one answer, and is closed.
 */

/** Connections served at once; a launcher asks once, at start. */
const MAX_CONNECTIONS = 64;
/** Time a connection has to send its request. */
const REQUEST_MS = 5_000;

export class VouchSocketError extends Error {
  override readonly name = "VouchSocketError";
}

export class VouchSocket {
  private constructor(
    private readonly server: Server,
    readonly path: string,
  ) {}

  /**
   * Listens at `path` (its folder made if missing; a socket left there by a dead daemon
   * replaced) and answers each request with `vouch(job)`: resolved is vouched, rejected says why not.
   */
  static async open(path: string, vouch: (job: string) => Promise<void>, log: Logger): Promise<VouchSocket> {
    try {
      mkdirSync(dirname(path), { recursive: true, mode: 0o755 });
    } catch (error) {
      throw new VouchSocketError(`--vouch-socket ${path}: cannot make its folder (${(error as Error).message}); give a path this daemon may create`);
    }
    const existing = lstatSync(path, { throwIfNoEntry: false });
    if (existing && !existing.isSocket()) throw new VouchSocketError(`--vouch-socket ${path} exists and is not a socket; give another path`);
    if (existing && (await listening(path))) throw new VouchSocketError(`--vouch-socket ${path}: another daemon listens there; give this one another path`);
    rmSync(path, { force: true });
    const server = createServer((socket) => serve(socket, vouch, log));
    server.maxConnections = MAX_CONNECTIONS;
    await new Promise<void>((resolve, reject) => {
      server.once("error", (error) => reject(new VouchSocketError(`--vouch-socket ${path}: ${error.message}`)));
      server.listen(path, resolve);
    });
    chmodSync(path, 0o666);
    return new VouchSocket(server, path);
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** Whether a process accepts connections at the socket `path` (else it is a dead daemon's). */
function listening(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = connect(path);
    probe.setTimeout(1_000, () => probe.destroy());
    probe.once("connect", () => {
      probe.destroy();
      resolve(true);
    });
    probe.once("close", () => resolve(false));
    probe.once("error", () => resolve(false));
  });
}

function serve(socket: Socket, vouch: (job: string) => Promise<void>, log: Logger): void {
  const answer = (reply: LocalVouchReply) => socket.end(`${JSON.stringify(reply)}\n`);
  socket.setTimeout(REQUEST_MS, () => socket.destroy());
  socket.on("error", () => socket.destroy());
  let line = "";
  socket.on("data", (chunk: Buffer) => {
    line += chunk.toString("utf8");
    const end = line.indexOf("\n");
    if (end < 0 && line.length <= MAX_LOCAL_VOUCH_BYTES) return;
    socket.removeAllListeners("data");
    if (end < 0 || end > MAX_LOCAL_VOUCH_BYTES) return answer({ error: `a request is one line of at most ${MAX_LOCAL_VOUCH_BYTES} bytes` });
    const request = parse(line.slice(0, end));
    if (typeof request === "string") return answer({ error: request });
    vouch(request.job).then(
      () => answer({ vouched: true }),
      (error: unknown) => {
        log.warn(() => `could not vouch for a launcher of job ${request.job}: ${(error as Error).message}`);
        answer({ error: (error as Error).message });
      },
    );
  });
}

/** The request, or why it is not one. */
function parse(text: string): { job: string } | string {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return 'a request is one JSON line, {"job": "ID"}';
  }
  const request = LocalVouchRequestSchema.safeParse(json);
  return request.success ? request.data : `${request.error.issues[0]?.path.join(".") || "request"}: ${request.error.issues[0]?.message}`;
}
