import { rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { createInterface } from "node:readline";
import { formatZodError } from "../../contract/errors.ts";
import { CHANNEL_VERSION, ChannelRequestSchema, MAX_CHANNEL_LINE_BYTES, type ChannelReply, type ChannelRequest } from "../../contract/protocol/channel.ts";
import type { Logger } from "../../contract/log.ts";

/**
 * The launcher's end of the local channel (see `sdk/contract/protocol/channel.ts`): a Unix socket that
 * reads one JSON request per line, checks it against its schema, and writes the handler's
 * answer as one line. A malformed line gets an `error` answer naming the field; it never
 * reaches the handler.
 */

export type ChannelHandler = (request: Exclude<ChannelRequest, { type: "phase" }>) => Promise<ChannelReply>;

export class ChannelServer {
  private constructor(
    private readonly server: Server,
    private readonly sockets: Set<Socket>,
    readonly path: string,
  ) {}

  static async open(
    path: string,
    handle: ChannelHandler,
    onPhase: (request: Extract<ChannelRequest, { type: "phase" }>) => void,
    log: Logger,
  ): Promise<ChannelServer> {
    rmSync(path, { force: true });
    const sockets = new Set<Socket>();
    const server = createServer((socket) => {
      sockets.add(socket);
      socket.once("close", () => sockets.delete(socket));
      socket.on("error", (error) => log.warn(() => `channel connection: ${error.message}`));
      const answer = (reply: ChannelReply) => {
        if (socket.writable) socket.write(`${JSON.stringify(reply)}\n`);
      };
      const lines = createInterface({ input: socket, crlfDelay: Infinity });
      // readline re-emits its input's errors (a process gone before its answer: EPIPE), which
      // the socket's own handler has logged; unheard, they would end the launcher.
      lines.on("error", () => {});
      // readline buffers a line until its newline, so the line's length is watched here.
      let unterminated = 0;
      socket.on("data", (chunk: Buffer) => {
        const newline = chunk.lastIndexOf(0x0a);
        unterminated = newline < 0 ? unterminated + chunk.length : chunk.length - newline - 1;
        if (unterminated <= MAX_CHANNEL_LINE_BYTES || !socket.writable) return;
        const message = `a request line is longer than ${MAX_CHANNEL_LINE_BYTES} bytes; send one JSON request per line`;
        log.warn(() => `channel: ${message}; closing the connection`);
        lines.close();
        answer({ v: CHANNEL_VERSION, type: "error", message });
        socket.destroySoon();
      });
      // One request at a time per connection: a process waits for each answer before the next.
      let queue = Promise.resolve();
      lines.on("line", (line) => {
        queue = queue.then(async () => {
          const request = parse(line);
          if ("error" in request) {
            log.warn(() => `channel: ${request.error}`);
            answer({ v: CHANNEL_VERSION, type: "error", message: request.error });
            return;
          }
          if (request.type === "phase") return onPhase(request);
          try {
            answer(await handle(request));
          } catch (failure) {
            log.error(() => `channel: ${request.type} from local rank ${request.localRank} failed: ${(failure as Error).message}`);
            answer({ v: CHANNEL_VERSION, type: "error", message: (failure as Error).message });
          }
        });
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(path, () => resolve());
    });
    return new ChannelServer(server, sockets, path);
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    rmSync(this.path, { force: true });
  }
}

function parse(line: string): ChannelRequest | { error: string } {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    return { error: `not JSON: ${line.slice(0, 80)}` };
  }
  const parsed = ChannelRequestSchema.safeParse(value);
  return parsed.success ? parsed.data : { error: formatZodError("channel request", parsed.error) };
}
