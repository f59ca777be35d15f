import { Router } from "zeromq";
import type { Planner } from "../plan/planner.ts";
import { encode, safeDecodeCommandReply, safeDecodeRequest } from "../../sdk/protocol/codec.ts";
import { errorReply, ProtocolError } from "../../sdk/protocol/errors.ts";
import { MAX_REQUEST_BYTES } from "../../sdk/protocol/limits.ts";
import { Controller, type ControllerOptions } from "./controller.ts";
import type { Outgoing } from "./context.ts";
import type { DaemonHosts } from "./daemon-hosts.ts";
import { Journal, type ReplayReport } from "./journal.ts";
import type { CurveKeys } from "./keys.ts";
import { createLogger, type Logger } from "../../sdk/log.ts";
import type { RecordBody } from "./state.ts";
import { RateLimiter, type RateLimits } from "./rate-limit.ts";

export interface ServerOptions extends Omit<ControllerOptions, "journal" | "state" | "logger"> {
  /** ZeroMQ address, e.g. `tcp://127.0.0.1:*` for any free port. */
  readonly bind: string;
  readonly journalDir: string;
  readonly config: Extract<RecordBody, { kind: "config" }>;
  /** With keys, only clients that hold the server's public key can talk to it. */
  readonly curve?: CurveKeys;
  readonly tickMs?: number;
  readonly logger?: Logger;
  readonly planner: Planner;
  /**
   * When the transport and launcher are per-host daemons on this socket: the server tells it
   * which peer registered each host, hands it their answers, and sends its commands.
   */
  readonly daemons?: DaemonHosts;
  /** Requests each peer may send; past them its requests are dropped unread. */
  readonly rateLimits?: RateLimits;
}

/**
 * The controller on a ZeroMQ ROUTER socket. Requests are decoded here (anything malformed is
 * answered with an error reply and logged) and handled by `Controller`; replies wait until
 * the journal records behind them are fsync'd, which happens once per burst of requests.
 */
export class ControllerServer {
  private scheduled = false;
  private sending: Promise<void> = Promise.resolve();
  private closed = false;
  private readonly timer: NodeJS.Timeout;
  private readonly loop: Promise<void>;
  private readonly limiter: RateLimiter;

  private constructor(
    private readonly socket: Router,
    readonly controller: Controller,
    private readonly journal: Journal,
    readonly endpoint: string,
    readonly replay: ReplayReport,
    private readonly log: Logger,
    tickMs: number,
    private readonly daemons: DaemonHosts | undefined,
    rateLimits: RateLimits | undefined,
  ) {
    this.limiter = new RateLimiter(rateLimits);
    controller.onWork = () => this.schedule();
    daemons?.attach((peer, frame) => this.enqueueFrames([{ peer, frame, what: "a command to a daemon" }]));
    this.timer = setInterval(() => controller.tick(), tickMs);
    this.loop = this.receive();
    this.schedule();
  }

  static async start(options: ServerOptions): Promise<ControllerServer> {
    const log = options.logger ?? createLogger("controller");
    const { journal, state, replay } = Journal.open(options.journalDir, options.config, options.clock);
    if (replay.tornTail) {
      const torn = replay.tornTail;
      log.warn(() => `journal ${journal.path}: dropped a torn last record (line ${torn.line}, ${torn.bytes} bytes) left by a crash`);
    }
    if (replay.records) log.info(() => `journal ${journal.path}: replayed ${replay.records} records, ${state.jobs.size} jobs`);
    const controller = new Controller({ ...options, journal, state, logger: log });
    // A larger frame disconnects its sender before it is read, so no client can make us buffer it.
    const socket = new Router({ linger: 0, sendHighWaterMark: 100_000, receiveHighWaterMark: 100_000, maxMessageSize: MAX_REQUEST_BYTES });
    if (options.curve) {
      socket.curveServer = true;
      socket.curvePublicKey = options.curve.publicKey;
      socket.curveSecretKey = options.curve.secretKey;
    }
    try {
      await socket.bind(options.bind);
    } catch (error) {
      socket.close();
      journal.close();
      throw new Error(`cannot bind ${options.bind}: ${(error as Error).message}; pick another --bind address`);
    }
    const endpoint = socket.lastEndpoint ?? options.bind;
    log.info(() => `listening on ${endpoint}${options.curve ? " (CURVE)" : ""}`);
    return new ControllerServer(socket, controller, journal, endpoint, replay, log, options.tickMs ?? 200, options.daemons, options.rateLimits);
  }

  /** Stops listening and closes the journal; held requests are left unanswered. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    this.daemons?.close();
    this.flush();
    await this.sending;
    this.socket.close();
    await this.loop;
    this.journal.close();
  }

  private async receive(): Promise<void> {
    try {
      for await (const [peer, ...frames] of this.socket) {
        if (!peer || !this.admit(peer)) continue;
        const body = frames.length === 1 ? frames[0] : undefined;
        if (!body) {
          this.reject(peer, 0, new ProtocolError("malformed", `expected one frame per message, got ${frames.length}; send the JSON message as a single frame`));
          continue;
        }
        const decoded = safeDecodeRequest(body);
        if (!decoded.success && decoded.error.code === "unknown_type" && this.daemons) {
          // Daemons answer the controller's commands on the same socket they send requests on.
          const answer = safeDecodeCommandReply(body);
          if (answer.success) {
            this.daemons.answer(peer, answer.data);
            continue;
          }
        }
        if (!decoded.success) {
          this.reject(peer, decoded.id ?? 0, decoded.error);
          continue;
        }
        const accepted = this.controller.handle(peer, decoded.data);
        // Only an accepted registration routes the host's commands to this peer.
        if (accepted && decoded.data.type === "daemon.register") this.daemons?.register(decoded.data.host, peer);
        // Replies that wait on no journal record (most barriers) go out at once; the others
        // wait for the burst's single fsync.
        if (this.journal.unflushed === 0) this.flush();
      }
    } catch (error) {
      if (!this.closed) this.log.error(() => `receive loop stopped: ${(error as Error).message}`);
    }
  }

  /**
   * Past its rate a peer's requests are dropped unread, not answered: an answer needs the
   * request id, so the frame would have to be parsed, which is the work the limit sheds. A
   * client's connection resends an unanswered request, so a legitimate burst only slows down.
   */
  private admit(peer: Uint8Array): boolean {
    const decision = this.limiter.take(Buffer.from(peer).toString("hex"), Date.now());
    if (decision === "refuse-first") this.log.warn(() => `peer ${Buffer.from(peer).toString("hex")} is over its request rate; dropping its requests until it slows down`);
    return decision === "allow";
  }

  private reject(peer: Uint8Array, id: number, error: ProtocolError): void {
    this.log.warn(() => `rejected a message: ${error.message}`);
    this.enqueue([{ peer, reply: errorReply(id, error.code, error.message) }]);
  }

  private schedule(): void {
    if (this.scheduled || this.closed) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    try {
      this.enqueue(this.controller.drain());
    } catch (error) {
      // Only the journal can fail here (a full or failing disk). Replies stay unsent, since
      // they may depend on records that are not durable; the next flush tries again.
      this.log.error(() => `journal write failed, replies held back: ${(error as Error).message}`);
    }
  }

  /** ZeroMQ allows one send in flight per socket, so replies go out in order through one chain. */
  private enqueue(out: readonly Outgoing[]): void {
    this.enqueueFrames(out.map(({ peer, reply }) => ({ peer, frame: encode(reply), what: `reply ${reply.type} #${reply.id}` })));
  }

  private enqueueFrames(out: readonly { peer: Uint8Array; frame: string; what: string }[]): void {
    if (out.length === 0) return;
    this.sending = this.sending.then(async () => {
      for (const { peer, frame, what } of out) {
        try {
          await this.socket.send([peer, frame]);
        } catch (error) {
          if (!this.closed) this.log.warn(() => `${what} not sent: ${(error as Error).message}`);
        }
      }
    });
  }
}
