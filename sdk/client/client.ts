import { ControllerConnection, ControllerError, UnexpectedReplyError, type Answer, type ConnectionOptions, type RequestBody } from "./connection.ts";
import { safeDecodeReply } from "../contract/protocol/codec.ts";
import type { EventsReply } from "../contract/protocol/events.ts";
import type { StatusReport } from "../contract/protocol/status.ts";
import type { Assignment, Order, Parallelism, Report, WorkerIdentity } from "../contract/protocol/worker.ts";

export { ClientClosedError, ControllerTimeoutError } from "./connection.ts";
export { ControllerError, UnexpectedReplyError };

/**
 * The launcher's side of the controller protocol, over one `ControllerConnection`. Many
 * workers may share one client; replies are matched by request id, and the orders the
 * controller pushes go to the listener of the worker they name.
 */

export type ClientOptions = Omit<ConnectionOptions, "onMessage">;

/** A registration is held while the job waits for its whole group, or a replacement for its move to commit. */
export const DEFAULT_WORKER_TIMEOUT_MS = 600_000;

export class ControllerClient {
  private readonly connection: ControllerConnection;
  private readonly listeners = new Map<string, (order: Order) => void>();

  constructor(options: ClientOptions) {
    this.connection = new ControllerConnection({ ...options, onMessage: (frame) => this.dispatch(frame) });
  }

  /** Orders for `worker` that answer no request of its (pushed, or late duplicates) go to `listener`. */
  listen(worker: WorkerIdentity, listener: (order: Order) => void): () => void {
    const key = keyOf(worker);
    this.listeners.set(key, listener);
    return () => {
      if (this.listeners.get(key) === listener) this.listeners.delete(key);
    };
  }

  private dispatch(frame: Buffer): void {
    const decoded = safeDecodeReply(frame);
    if (decoded.success && decoded.data.type === "worker.order") this.listeners.get(keyOf(decoded.data.worker))?.(decoded.data.order);
  }

  /** Sends a request and waits for its answer; an error reply rejects with `ControllerError`. */
  request(body: RequestBody, timeoutMs?: number): Promise<Answer> {
    return this.connection.request(body, timeoutMs);
  }

  async register(
    worker: WorkerIdentity,
    parallelism: Parallelism,
    options: { checkpointBytes?: number; rings?: number; token?: string; replacement?: string; timeoutMs?: number } = {},
  ): Promise<Assignment> {
    const reply = await this.request(
      {
        type: "worker.register",
        worker,
        parallelism,
        checkpointBytes: options.checkpointBytes ?? 0,
        ...(options.rings === undefined ? {} : { rings: options.rings }),
        ...(options.token === undefined ? {} : { token: options.token }),
        ...(options.replacement === undefined ? {} : { replacement: options.replacement }),
      },
      options.timeoutMs,
    );
    if (reply.type !== "worker.registered") throw unexpected("worker.register", reply);
    return reply.assignment;
  }

  /** Reports a worker's progress and hold; answers with its current order. */
  async report(report: Omit<Report, "v" | "id" | "type">, timeoutMs?: number): Promise<Order> {
    const reply = await this.request({ type: "worker.report", ...report }, timeoutMs);
    if (reply.type !== "worker.order") throw unexpected("worker.report", reply);
    return reply.order;
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

  /** The controller's events after `after` (a `seq`), or without it its latest few. */
  async events(after?: number, timeoutMs?: number): Promise<EventsReply> {
    const reply = await this.request({ type: "events", ...(after === undefined ? {} : { after }) }, timeoutMs);
    if (reply.type !== "events.batch") throw unexpected("events", reply);
    return reply;
  }

  /** Closes the socket; requests still waiting reject with `ClientClosedError`. */
  close(): Promise<void> {
    return this.connection.close();
  }
}

const unexpected = (request: string, reply: Answer) => new UnexpectedReplyError(`${request} was answered with ${reply.type}`);

const keyOf = (w: WorkerIdentity): string => `${w.job}/${w.group}/${w.host}`;
