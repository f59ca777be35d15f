import { performance } from "node:perf_hooks";
import { Context, Reply, Router } from "zeromq";
import { encode, safeDecodeCommandReply, safeDecodeRequest, type Reply as ReplyMessage } from "../../sdk/contract/protocol/codec.ts";
import { errorReply, ProtocolError } from "../../sdk/contract/protocol/errors.ts";
import { MAX_REQUEST_BYTES } from "../../sdk/contract/protocol/limits.ts";
import { Controller, type ControllerOptions } from "./controller.ts";
import type { Outgoing } from "./context.ts";
import type { DaemonHosts } from "./daemon-hosts.ts";
import { EventLog } from "./event-log.ts";
import { Journal, type ReplayReport } from "./journal.ts";
import { Authenticator, keyringChange, type Keyring, type KeyringClient } from "./keys.ts";
import { ANYONE, authorize, type Caller } from "./authorization.ts";
import { BindError } from "../../sdk/contract/errors.ts";
import { createLogger, type Logger } from "../../sdk/contract/log.ts";
import type { RecordBody } from "./state.ts";
import { RateLimiter, type RateLimits } from "./rate-limit.ts";

export interface ServerOptions extends Omit<ControllerOptions, "journal" | "state" | "logger" | "eventLog"> {
  /** ZeroMQ address, e.g. `tcp://127.0.0.1:*` for any free port. */
  readonly bind: string;
  readonly journalDir: string;
  readonly config: Extract<RecordBody, { kind: "config" }>;
  /** Start from a journal that lost records below its mark (`Journal.open`'s `acceptLoss`), with a warning. */
  readonly acceptJournalLoss?: boolean;
  /**
   * With a keyring the socket speaks CURVE and admits only the keyring's client keys, and every
   * message must prove its key (`sdk/contract/protocol/auth.ts`); its principal decides what it may do.
   * Without one, anyone who reaches the address may do anything.
   */
  readonly keyring?: Keyring;
  readonly tickMs?: number;
  readonly logger?: Logger;
  /**
   * When the transport and launcher are per-host daemons on this socket: the server tells it
   * which peer registered each host, hands it their answers, and sends its commands.
   */
  readonly daemons?: DaemonHosts;
  /**
   * Requests each connection may send, and with a keyring each key across all its connections;
   * past them its requests are dropped.
   */
  readonly rateLimits?: RateLimits;
  /** Bytes of `events.jsonl` before it rotates (default `DEFAULT_EVENT_LOG_BYTES`). */
  readonly eventLogBytes?: number;
}

/**
 * The controller on a ZeroMQ ROUTER socket. Requests are decoded here (anything malformed is
 * answered with an error reply and logged) and handled by `Controller`; replies wait until
 * the journal records behind them are fsync'd, which happens once per burst of requests.
 */
export class ControllerServer {
  private scheduled = false;
  /** Whether the receive loop is inside `controller.handle`, and whether that asked for a drain. */
  private handling = false;
  private workWhileHandling = false;
  /** Frames waiting for the socket, oldest first, and the one loop that sends them. */
  private queue: OutFrame[] = [];
  private sending: Promise<void> | null = null;
  private closed = false;
  private readonly timer: NodeJS.Timeout;
  private readonly loop: Promise<void>;
  private readonly zapLoop: Promise<void>;
  /** Buckets per connection (every message, before it is read) and per keyring key (after its MAC). */
  private readonly limiter: RateLimiter;
  private readonly principals: RateLimiter;
  private droppedCount = 0;

  private constructor(
    private readonly socket: Router,
    readonly controller: Controller,
    private readonly journal: Journal,
    readonly endpoint: string,
    readonly replay: ReplayReport,
    private readonly log: Logger,
    tickMs: number,
    private readonly daemons: DaemonHosts | undefined,
    private auth: Authenticator | null,
    private readonly zap: Reply | null,
    rateLimits: RateLimits | undefined,
  ) {
    this.limiter = new RateLimiter(rateLimits);
    this.principals = new RateLimiter(rateLimits);
    // Work that comes up while a request is handled is drained by the receive loop right after
    // it, when no journal record waits: a barrier's answer does not also schedule a drain, which
    // would cost the event loop a turn for every burst of barriers.
    controller.onWork = () => {
      if (this.handling) this.workWhileHandling = true;
      else this.schedule();
    };
    daemons?.attach((peer, frame) => this.enqueueFrames([{ peer, frame, what: "a command to a daemon" }]));
    let ticked = performance.now();
    this.timer = setInterval(() => {
      // A tick later than its interval means this event loop was blocked (a slow fsync, a long
      // plan): the heartbeats of that time wait unread in the socket, and they are read only
      // after this tick, so the controller's deafness must not count as the daemons' silence.
      const now = performance.now();
      controller.tick(Math.max(0, now - ticked - tickMs));
      ticked = now;
    }, tickMs);
    this.loop = this.receive();
    this.zapLoop = zap ? this.answerZap(zap) : Promise.resolve();
    this.schedule();
  }

  /**
   * Replays the journal and binds the socket.
   *
   * @throws JournalError when the journal cannot be used (see `Journal.open`)
   * @throws BindError when `bind` cannot be bound: a port in use, an address of another host
   */
  static async start(options: ServerOptions): Promise<ControllerServer> {
    const log = options.logger ?? createLogger("controller");
    const { journal, state, replay } = Journal.open(options.journalDir, options.config, options.clock, { acceptLoss: options.acceptJournalLoss ?? false });
    if (replay.lost) {
      const { expected, found } = replay.lost;
      log.warn(
        () =>
          `journal ${journal.path}: started from ${found} records of the ${expected} written (--accept-journal-loss); the changes in the others are forgotten`,
      );
    }
    if (replay.tornTail) {
      const torn = replay.tornTail;
      log.warn(() => `journal ${journal.path}: dropped a torn last record (line ${torn.line}, ${torn.bytes} bytes) left by a crash`);
    }
    if (replay.records) log.info(() => `journal ${journal.path}: replayed ${replay.records} records, ${state.jobs.size} jobs`);
    const eventLog = new EventLog({
      dir: options.journalDir,
      log,
      ...(options.clock ? { clock: options.clock } : {}),
      ...(options.eventLogBytes ? { maxBytes: options.eventLogBytes } : {}),
    });
    // The keyring of the moment names jobs' users: a reload (SIGHUP) applies to later moves.
    let jobUser = (_job: string): string | null => null;
    const controller = new Controller({
      ...options,
      jobUser: (job) => jobUser(job),
      journal,
      state,
      logger: log,
      eventLog,
      daemonRegistered: (host, peer, endpoint) => options.daemons?.register(host, peer, endpoint),
    });
    // A context of its own, so its ZAP handler (one per context) answers for this socket only.
    const context = new Context();
    // A larger frame disconnects its sender before it is read, so no client can make us buffer it.
    const socket = new Router({ context, linger: 0, sendHighWaterMark: 100_000, receiveHighWaterMark: 100_000, maxMessageSize: MAX_REQUEST_BYTES });
    const keyring = options.keyring;
    let zap: Reply | null = null;
    try {
      if (keyring) {
        // libzmq asks the handler at inproc://zeromq.zap.01 about every CURVE handshake.
        zap = new Reply({ context, linger: 0 });
        await zap.bind("inproc://zeromq.zap.01");
        socket.zapDomain = "monkeytree";
        socket.curveServer = true;
        socket.curvePublicKey = keyring.publicKey;
        socket.curveSecretKey = keyring.secretKey;
      }
      await socket.bind(options.bind);
    } catch (error) {
      socket.close();
      zap?.close();
      journal.close();
      throw new BindError(options.bind, (error as Error).message);
    }
    const endpoint = socket.lastEndpoint ?? options.bind;
    log.info(() => `listening on ${endpoint}${keyring ? ` (CURVE, ${keyring.clients.length} client keys)` : ""}`);
    const auth = keyring ? new Authenticator(keyring) : null;
    const server = new ControllerServer(
      socket,
      controller,
      journal,
      endpoint,
      replay,
      log,
      options.tickMs ?? 200,
      options.daemons,
      auth,
      zap,
      options.rateLimits,
    );
    jobUser = (job) => server.auth?.userOf(job) ?? options.jobUser?.(job) ?? null;
    return server;
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
    this.zap?.close();
    await Promise.all([this.loop, this.zapLoop, this.controller.close()]);
    this.journal.close();
  }

  /** Requests dropped by a rate limit since the start, per connection or per key. */
  get dropped(): number {
    return this.droppedCount;
  }

  /**
   * Replaces the keyring's client keys (SIGHUP): a key added is admitted at its next handshake,
   * and a key removed is refused from its next message on, on connections already open too,
   * since every message's key is checked against the keyring of the moment. The controller's
   * own keypair cannot change while it listens.
   *
   * @throws Error when this controller has no keyring, or `keyring` has another keypair; the
   *   keyring in use is then kept whole
   */
  reloadKeyring(keyring: Keyring): { added: string[]; removed: string[] } {
    const auth = this.auth;
    if (!auth) throw new Error("this controller was started without --keys; restart it with --keys DIR to use a keyring");
    if (!auth.sameServer(keyring))
      throw new Error("the keyring's controller keypair differs from the one this controller listens with; restart it to change keypairs");
    this.auth = new Authenticator(keyring);
    return keyringChange(auth.keyring, keyring);
  }

  private async receive(): Promise<void> {
    try {
      for await (const [peer, body, auth, ...rest] of this.socket) {
        if (!peer || !this.admit(peer)) continue;
        // The JSON message, and with a keyring its auth frame; a client without a credential
        // sends one frame, and one with a credential two, which a keyless controller ignores.
        if (!body || rest.length > 0) {
          this.reject(peer, 0, new ProtocolError("malformed", `expected the JSON message and at most an auth frame, got ${rest.length + 2} frames`));
          continue;
        }
        const caller = this.callerOf(peer, body, auth);
        if (caller) this.dispatch(peer, body, caller);
      }
    } catch (error) {
      if (!this.closed) this.log.error(() => `receive loop stopped: ${(error as Error).message}`);
    }
  }

  /**
   * Who sent `body`: `anyone` without a keyring; else the keyring client its auth frame proves,
   * charged to that key's bucket. Null when the proof fails (answered with the refusal) or the
   * key is over its rate (dropped). A failed proof is charged to its connection only, so no
   * traffic that cannot make a key's MAC spends that key's requests.
   */
  private callerOf(peer: Uint8Array, body: Uint8Array, auth: Uint8Array | undefined): Caller | null {
    if (!this.auth) return ANYONE;
    let sender: KeyringClient;
    try {
      sender = this.auth.senderOf(body, auth);
    } catch (error) {
      const failure =
        error instanceof ProtocolError ? error : new ProtocolError("internal", `the controller could not check the auth frame: ${(error as Error).message}`);
      const decoded = safeDecodeRequest(body);
      this.reject(peer, decoded.success ? decoded.data.id : (decoded.id ?? 0), failure);
      return null;
    }
    // A job's key stands for all its launchers: its bucket grows with them, each as much as a connection.
    const scale = sender.principal.role === "job" ? Math.max(1, this.controller.workersOf(sender.principal.job)) : 1;
    const decision = this.principals.take(sender.publicKey, Date.now(), scale);
    if (decision === "refuse-first")
      this.log.warn(() => `${sender.name} is over its request rate across its connections; dropping its requests until it slows down`);
    if (decision === "allow") return sender.principal;
    this.droppedCount += 1;
    return null;
  }

  /** Decodes an authorised message and hands it to the controller, or a command's answer to the daemons. */
  private dispatch(peer: Uint8Array, body: Uint8Array, caller: Caller): void {
    const decoded = safeDecodeRequest(body);
    if (!decoded.success && decoded.error.code === "unknown_type" && this.daemons) {
      // Daemons answer the controller's commands on the same socket they send requests on.
      const answer = safeDecodeCommandReply(body);
      if (answer.success) {
        const refusal = authorize(caller, answer.data);
        if (refusal) this.log.warn(() => `dropped ${answer.data.type} #${answer.data.id}: ${refusal.rule}: ${refusal.message}`);
        else this.daemons.answer(peer, answer.data);
        return;
      }
    }
    if (!decoded.success) {
      this.reject(peer, decoded.id ?? 0, decoded.error);
      return;
    }
    this.handling = true;
    this.workWhileHandling = false;
    try {
      this.controller.handle(peer, decoded.data, caller);
    } finally {
      this.handling = false;
    }
    // Replies that wait on no journal record (most barriers) go out at once; the others
    // wait for the burst's single fsync.
    if (this.journal.unflushed === 0) this.flush();
    else if (this.workWhileHandling) this.schedule();
  }

  /**
   * The ZAP handler (RFC 27): a CURVE handshake completes only for a client key in the
   * keyring; any other is answered 400 and its connection never carries a message.
   */
  private async answerZap(zap: Reply): Promise<void> {
    try {
      for await (const [version, requestId, , , , mechanism, key] of zap) {
        const admitted = mechanism?.toString() === "CURVE" && key !== undefined && this.auth?.admits(key) === true;
        if (!admitted) this.log.warn(() => `refused a ${mechanism?.toString() ?? "?"} handshake: its client key is not in the keyring`);
        await zap.send([version ?? "1.0", requestId ?? "", admitted ? "200" : "400", admitted ? "OK" : "client key not in the keyring", "", ""]);
      }
    } catch (error) {
      if (!this.closed) this.log.error(() => `ZAP handler stopped: ${(error as Error).message}`);
    }
  }

  /**
   * Past its rate a connection's requests are dropped unread, not answered: an answer needs the
   * request id, so the frame would have to be parsed, which is the work the limit sheds. A
   * client's connection resends an unanswered request, so a legitimate burst only slows down.
   * This is the only limit without a keyring, where nothing tells senders apart; with one, a
   * key's connections also share the key's bucket (`callerOf`).
   */
  private admit(peer: Uint8Array): boolean {
    // The identity's bytes as the bucket's key, read in place: this runs for every message.
    const identity = Buffer.isBuffer(peer) ? peer : Buffer.from(peer.buffer, peer.byteOffset, peer.byteLength);
    const decision = this.limiter.take(identity.toString("latin1"), Date.now());
    if (decision === "refuse-first")
      this.log.warn(() => `peer ${identity.toString("hex")} is over its request rate; dropping its requests until it slows down`);
    if (decision !== "allow") this.droppedCount += 1;
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

  private enqueue(out: readonly Outgoing[]): void {
    for (const { peer, reply } of out) this.queue.push({ peer, frame: encode(reply), what: reply });
    this.pump();
  }

  private enqueueFrames(out: readonly OutFrame[]): void {
    this.queue.push(...out);
    this.pump();
  }

  /**
   * ZeroMQ allows one send in flight per socket, so one loop sends the queued frames in order
   * while there are any; a burst of replies costs no promise chain of its own.
   */
  private pump(): void {
    if (this.sending || this.queue.length === 0) return;
    this.sending = (async () => {
      while (this.queue.length) {
        const batch = this.queue;
        this.queue = [];
        for (const { peer, frame, what } of batch) {
          try {
            await this.socket.send([peer, frame]);
          } catch (error) {
            if (!this.closed)
              this.log.warn(() => `${typeof what === "string" ? what : `reply ${what.type} #${what.id}`} not sent: ${(error as Error).message}`);
          }
        }
      }
      this.sending = null;
    })();
  }
}

interface OutFrame {
  readonly peer: Uint8Array;
  readonly frame: string;
  /** What the frame is, for the warning when it cannot be sent: a reply is named only then. */
  readonly what: string | ReplyMessage;
}
