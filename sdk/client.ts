import { ControllerConnection, ControllerError, UnexpectedReplyError, type Answer, type ConnectionOptions, type RequestBody } from "./connection.ts";
import type { EventsReply } from "./protocol/events.ts";
import type { StatusReport } from "./protocol/status.ts";
import type { Assignment, Directive, Parallelism, WorkerIdentity } from "./protocol/worker.ts";

export { ClientClosedError, ControllerTimeoutError } from "./connection.ts";
export { ControllerError, UnexpectedReplyError };

/**
 * The launcher's side of the controller protocol, over one `ControllerConnection`. Many
 * workers may share one client; replies are matched by request id.
 */

export type ClientOptions = Omit<ConnectionOptions, "onMessage">;

/**
 * A barrier (or a registration) may be held while the job waits for its whole group or for a
 * migration, which takes seconds to tens of seconds (paper §7), so workers wait longer.
 */
export const DEFAULT_WORKER_TIMEOUT_MS = 600_000;

export class ControllerClient {
  private readonly connection: ControllerConnection;

  constructor(options: ClientOptions) {
    this.connection = new ControllerConnection(options);
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
    private readonly options: { checkpointBytes?: number; rings?: number; token?: string; replacement?: string; barrierTimeoutMs?: number } = {},
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
