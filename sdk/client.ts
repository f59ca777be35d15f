import { curveKeyPair, Dealer } from "zeromq";
import { PROTOCOL_VERSION } from "./protocol/envelope.ts";
import { encode, safeDecodeReply, type Reply, type Request } from "./protocol/codec.ts";
import type { ErrorCode } from "./protocol/errors.ts";
import type { StatusReport } from "./protocol/status.ts";
import type { Assignment, Directive, Parallelism, WorkerIdentity } from "./protocol/worker.ts";

/**
 * The launcher's side of the controller protocol over one ZeroMQ DEALER. Requests are
 * idempotent, so a request without an answer is sent again every `retryMs` until its
 * deadline: that rides out a controller restart (ZeroMQ reconnects by itself) and lost
 * replies. Many workers may share one client; replies are matched by request id.
 */

export interface ClientOptions {
  /** The controller's address, e.g. `tcp://10.0.0.1:5555`. */
  readonly endpoint: string;
  /** The controller's CURVE public key (Z85); required when the controller uses CURVE. */
  readonly serverKey?: string;
  /** Default deadline of a request, in ms. */
  readonly timeoutMs?: number;
  /** Resend an unanswered request this often, in ms. */
  readonly retryMs?: number;
}

/** The controller refused a request; `code` says why (see `ErrorCode`). */
export class ControllerError extends Error {
  override readonly name = "ControllerError";
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** No answer before the deadline: the controller is down, unreachable, or holds another key. */
export class ControllerTimeoutError extends Error {
  override readonly name = "ControllerTimeoutError";
  readonly code = "timeout";
  constructor(
    readonly request: string,
    readonly endpoint: string,
    readonly timeoutMs: number,
  ) {
    super(`no answer to ${request} from ${endpoint} within ${timeoutMs} ms; check that the controller runs there and that --server-key matches its CURVE key`);
  }
}

/** The client was closed while a request waited. */
export class ClientClosedError extends Error {
  override readonly name = "ClientClosedError";
  readonly code = "closed";
}

/** An answer of another type than the request calls for. */
export class UnexpectedReplyError extends Error {
  override readonly name = "UnexpectedReplyError";
  readonly code = "unexpected_reply";
}

type Body = Request extends infer R ? (R extends Request ? Omit<R, "v" | "id"> : never) : never;

interface Waiting {
  readonly resolve: (reply: Reply) => void;
  readonly reject: (error: Error) => void;
}

export const DEFAULT_TIMEOUT_MS = 30_000;
export const DEFAULT_RETRY_MS = 1_000;
/**
 * A barrier (or a registration) may be held while the job waits for its whole group or for a
 * migration, which takes seconds to tens of seconds (paper §7), so workers wait longer.
 */
export const DEFAULT_WORKER_TIMEOUT_MS = 600_000;

/**
 * A DEALER connected to the controller, reconnecting on its own; with the controller's CURVE
 * public key it authenticates with a fresh keypair of its own.
 */
export function connectToController(endpoint: string, serverKey?: string): Dealer {
  const socket = new Dealer({ linger: 0, reconnectInterval: 100, reconnectMaxInterval: 1_000 });
  if (serverKey !== undefined) {
    const own = curveKeyPair();
    socket.curveServerKey = serverKey;
    socket.curvePublicKey = own.publicKey;
    socket.curveSecretKey = own.secretKey;
  }
  socket.connect(endpoint);
  return socket;
}

export class ControllerClient {
  private readonly socket: Dealer;
  private readonly waiting = new Map<number, Waiting>();
  private nextId = 1;
  private sending: Promise<void> = Promise.resolve();
  private closed = false;
  private readonly loop: Promise<void>;

  constructor(private readonly options: ClientOptions) {
    this.socket = connectToController(options.endpoint, options.serverKey);
    this.loop = this.receive();
  }

  /** Sends a request and waits for its answer; an error reply rejects with `ControllerError`. */
  async request(body: Body, timeoutMs = this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS): Promise<Reply> {
    if (this.closed) throw new ClientClosedError("the client is closed");
    const id = this.nextId++;
    const frame = encode({ ...body, v: PROTOCOL_VERSION, id } as Request);
    const retryMs = this.options.retryMs ?? DEFAULT_RETRY_MS;
    const reply = await new Promise<Reply>((resolve, reject) => {
      const deadline = setTimeout(() => finish(() => reject(new ControllerTimeoutError(`${body.type} #${id}`, this.options.endpoint, timeoutMs))), timeoutMs);
      const retry = setInterval(() => this.send(frame), retryMs);
      const finish = (settle: () => void) => {
        clearTimeout(deadline);
        clearInterval(retry);
        this.waiting.delete(id);
        settle();
      };
      this.waiting.set(id, { resolve: (r) => finish(() => resolve(r)), reject: (e) => finish(() => reject(e)) });
      this.send(frame);
    });
    if (reply.type === "error") throw new ControllerError(reply.code, reply.message);
    return reply;
  }

  async register(
    worker: WorkerIdentity,
    parallelism: Parallelism,
    options: { checkpointBytes?: number; rings?: number; token?: string; launch?: readonly string[]; timeoutMs?: number } = {},
  ): Promise<Assignment> {
    const reply = await this.request(
      {
        type: "worker.register",
        worker,
        parallelism,
        checkpointBytes: options.checkpointBytes ?? 0,
        ...(options.rings === undefined ? {} : { rings: options.rings }),
        ...(options.token === undefined ? {} : { token: options.token }),
        ...(options.launch === undefined ? {} : { launch: [...options.launch] }),
      },
      options.timeoutMs,
    );
    if (reply.type !== "worker.registered") throw unexpected("worker.register", reply);
    return reply.assignment;
  }

  async barrier(worker: WorkerIdentity, step: number, generation: number, timeoutMs?: number): Promise<Directive> {
    const reply = await this.request({ type: "worker.barrier", worker, step, generation }, timeoutMs);
    if (reply.type !== "worker.directive") throw unexpected("worker.barrier", reply);
    return reply.directive;
  }

  async finish(job: string): Promise<void> {
    const reply = await this.request({ type: "job.finish", job });
    if (reply.type !== "job.finished") throw unexpected("job.finish", reply);
  }

  async status(timeoutMs?: number): Promise<StatusReport> {
    const reply = await this.request({ type: "status" }, timeoutMs);
    if (reply.type !== "status.report") throw unexpected("status", reply);
    return reply;
  }

  /** Closes the socket; requests still waiting reject with `ClientClosedError`. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const waiting of [...this.waiting.values()]) waiting.reject(new ClientClosedError("the client was closed while waiting"));
    this.socket.close();
    await this.loop;
  }

  private send(frame: string): void {
    this.sending = this.sending.then(
      () => this.socket.send(frame),
    ).catch(() => {
      // A send fails only when the socket is closing; the request's deadline reports it.
    });
  }

  private async receive(): Promise<void> {
    try {
      for await (const [frame] of this.socket) {
        if (!frame) continue;
        const decoded = safeDecodeReply(frame);
        const id = decoded.success ? decoded.data.id : decoded.id;
        if (id === null) continue;
        const waiting = this.waiting.get(id);
        if (!waiting) continue;
        if (decoded.success) waiting.resolve(decoded.data);
        else waiting.reject(new ControllerError(decoded.error.code, `the controller's answer could not be read: ${decoded.error.message}`));
      }
    } catch {
      // The iterator ends with an error only when the socket is closed under it.
    }
  }
}

const unexpected = (request: string, reply: Reply) => new UnexpectedReplyError(`${request} was answered with ${reply.type}`);

/**
 * One worker's view: registers it, then meets the controller at every barrier, keeping the
 * assignment current as `reconfigure` directives arrive.
 */
export class WorkerClient {
  private current: Assignment | null = null;

  constructor(
    private readonly client: ControllerClient,
    readonly worker: WorkerIdentity,
    readonly parallelism: Parallelism,
    private readonly options: { checkpointBytes?: number; rings?: number; token?: string; launch?: readonly string[]; barrierTimeoutMs?: number } = {},
  ) {}

  get assignment(): Assignment | null {
    return this.current;
  }

  /** Waits until every worker of the job registered, then returns this worker's assignment. */
  async register(timeoutMs?: number): Promise<Assignment> {
    this.current = await this.client.register(this.worker, this.parallelism, { ...this.options, timeoutMs: timeoutMs ?? DEFAULT_WORKER_TIMEOUT_MS });
    return this.current;
  }

  /**
   * Call at the end of every iteration. `continue` returns at once unless the job is
   * stopping for a migration, in which case the answer comes when the job may go on.
   */
  async barrier(step: number): Promise<Directive> {
    if (!this.current) throw new ControllerError("unknown_worker", "register the worker before its first barrier");
    const directive = await this.client.barrier(this.worker, step, this.current.generation, this.options.barrierTimeoutMs ?? DEFAULT_WORKER_TIMEOUT_MS);
    if (directive.kind === "reconfigure") this.current = directive.assignment;
    return directive;
  }
}
