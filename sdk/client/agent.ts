import { performance } from "node:perf_hooks";
import { ControllerError, ControllerTimeoutError, DEFAULT_WORKER_TIMEOUT_MS, type ControllerClient } from "./client.ts";
import {
  advance,
  DEFAULT_HOLD_TIMEOUT_MS,
  holdReport,
  initialHold,
  lastStep,
  NO_STOP,
  stopWord,
  type Answer,
  type HoldEvent,
  type HostHold,
  type HostPhase,
} from "./hold.ts";
import type { Logger } from "../contract/log.ts";
import type { Assignment, Directive, Order, Parallelism, WorkerIdentity } from "../contract/protocol/worker.ts";

/**
 * One host's worker as the controller sees it: registers it, answers its local processes'
 * barriers on the host (`sdk/client/hold.ts` decides), reports progress on a timer of its own and at
 * once when the hold changes, and takes the orders the controller answers and pushes. A
 * controller that is down, slow or restarting costs no training step: barriers never wait for
 * it unless the job stops for a move, and a stop it never follows up ends after the hold timeout.
 */

/**
 * How often a host reports: the controller hears its step and that it lives, and each answer
 * renews a hold. A change of the hold is reported at once besides, so a stop does not wait for it.
 */
export const DEFAULT_REPORT_INTERVAL_MS = 1_000;
/** How often the hold timeout is checked. */
const TICK_MS = 250;
/** Recent step times kept for the median a report carries. */
const STEP_HISTORY = 16;

export interface AgentOptions {
  /** Local processes; every one of them calls each barrier. */
  readonly ranks: number;
  readonly checkpointBytes?: number;
  readonly rings?: number;
  /** A replacement's migration token. */
  readonly token?: string;
  readonly replacement?: string;
  readonly holdTimeoutMs?: number;
  readonly reportIntervalMs?: number;
  readonly log?: Logger;
  /** Every local process saved its checkpoint: send it, then call `sent`. */
  readonly onSend?: (migrateOut: Extract<Directive, { kind: "migrate-out" }>) => void;
  /** Where processes pass barriers without a message (the launcher's control block). */
  readonly control?: ControlWords;
  /** A process reached a barrier beyond every one seen before (by message, or in the control block). */
  readonly onStep?: (step: number) => void;
}

/**
 * The control block's words (sdk/contract/protocol/channel.ts), each access sequentially consistent:
 * `publish` writes the stop word, `passed` reads the furthest barrier any process's word names.
 */
export interface ControlWords {
  publish(word: number): void;
  passed(): number;
}

const silent: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

export class HostAgent {
  private hold: HostHold | null = null;
  private current: Assignment | null = null;
  private readonly waiters = new Map<number, (answer: Answer) => void>();
  private migrateOut: Extract<Directive, { kind: "migrate-out" }> | null = null;
  private timer: NodeJS.Timeout | null = null;
  private unlisten: () => void = () => {};
  private reportedAt = -Infinity;
  /** The newest barrier a process reached, when, and the recent step times. */
  private newest: { step: number; at: number } | null = null;
  private readonly stepMs: number[] = [];
  /** The stop word last published to the control block. */
  private published = NO_STOP;
  /**
   * After a re-formation, the first barrier of the new group is asked over the channel, so that
   * the launcher sees when training resumed (the downtime of a move) at once, not at its next tick.
   */
  private resumeAt: number | null = null;
  /** Why the last report failed, logged once until one succeeds. */
  private failing: string | null = null;
  private readonly log: Logger;
  private readonly holdTimeoutMs: number;
  private readonly reportIntervalMs: number;

  constructor(
    private readonly client: ControllerClient,
    readonly worker: WorkerIdentity,
    readonly parallelism: Parallelism,
    private readonly options: AgentOptions,
  ) {
    this.log = options.log ?? silent;
    this.holdTimeoutMs = options.holdTimeoutMs ?? DEFAULT_HOLD_TIMEOUT_MS;
    this.reportIntervalMs = options.reportIntervalMs ?? DEFAULT_REPORT_INTERVAL_MS;
  }

  get assignment(): Assignment | null {
    return this.current;
  }

  get phase(): HostPhase | null {
    return this.hold?.phase ?? null;
  }

  /** The stop this host holds at or trains toward. */
  get stop(): { readonly id: string; readonly step: number } | null {
    return this.hold?.stop ?? null;
  }

  /** Waits until every worker of the job registered, then starts reporting. */
  async register(timeoutMs = DEFAULT_WORKER_TIMEOUT_MS): Promise<Assignment> {
    const { checkpointBytes, rings, token, replacement } = this.options;
    const assignment = await this.client.register(this.worker, this.parallelism, {
      checkpointBytes: checkpointBytes ?? 0,
      ...(rings === undefined ? {} : { rings }),
      ...(token === undefined ? {} : { token }),
      ...(replacement === undefined ? {} : { replacement }),
      timeoutMs,
    });
    this.current = assignment;
    this.hold = initialHold(this.options.ranks, assignment.generation, performance.now(), assignment.resumeStep ?? -1);
    this.unlisten = this.client.listen(this.worker, (order) => this.obey(order));
    this.timer = setInterval(() => this.tick(), Math.min(TICK_MS, this.reportIntervalMs));
    // The reports keep the worker known to be alive, never the process itself.
    this.timer.unref();
    this.report();
    return assignment;
  }

  /** Local process `rank` reached barrier `step`; resolves with what it must do. */
  arrive(rank: number, step: number): Promise<Answer> {
    return this.wait(rank, { type: "arrive", rank, step }, step);
  }

  /** After `migrate-out`, local process `rank` saved its checkpoint; resolves with the move's outcome for it. */
  saved(rank: number): Promise<Answer> {
    return this.wait(rank, { type: "saved", rank });
  }

  /** The host's checkpoint went out, or failed to: the destination tells the controller which. */
  sent(): void {
    this.apply({ type: "sent" });
  }

  /** Stops reporting; waiting processes are left unanswered. */
  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.unlisten();
  }

  private wait(rank: number, event: HoldEvent, step?: number): Promise<Answer> {
    if (this.waiters.has(rank))
      return Promise.resolve({ kind: "error", message: `local rank ${rank} already waits for an answer; call barrier once per step and wait for its answer` });
    if (!this.hold) return Promise.resolve({ kind: "error", message: "the worker is not registered yet: attach first" });
    if (step !== undefined) this.timeStep(step);
    return new Promise((resolve) => {
      this.waiters.set(rank, resolve);
      this.apply(event);
    });
  }

  private obey(order: Order): void {
    this.apply({ type: "order", order });
  }

  private apply(event: HoldEvent): void {
    if (!this.hold) return;
    const control = this.options.control;
    // The stop goes into the block before the processes' words are read: a process that passed a
    // barrier meanwhile either saw the stop or is seen here (sdk/contract/protocol/channel.ts).
    if (control && event.type === "order" && event.order.kind === "stop-at") {
      control.publish(Math.min(event.order.step, this.published));
      this.hold = advance(this.hold, { type: "passed", step: control.passed() }, performance.now(), this.holdTimeoutMs).state;
    }
    const next = advance(this.hold, event, performance.now(), this.holdTimeoutMs);
    this.hold = next.state;
    if (next.answers.some((a) => a.answer.kind === "reconfigure")) this.resumeAt = next.state.passed + 1;
    else if (event.type === "arrive" && this.resumeAt !== null && event.step >= this.resumeAt) this.resumeAt = null;
    const word = Math.min(stopWord(next.state), this.resumeAt ?? NO_STOP);
    if (control && word !== this.published) {
      control.publish(word);
      this.published = word;
    }
    if (next.log) {
      const line = next.log;
      (line.startsWith("no word") || line.startsWith("ignored") ? this.log.warn : this.log.info)(() => line);
    }
    for (const { rank, answer } of next.answers) {
      if (answer.kind === "reconfigure") this.current = answer.assignment;
      if (answer.kind === "migrate-out") this.migrateOut = answer;
      const waiter = this.waiters.get(rank);
      this.waiters.delete(rank);
      waiter?.(answer);
    }
    if (next.send && this.migrateOut) this.options.onSend?.(this.migrateOut);
    // A stopped worker has nothing more to say: its replacement, or nobody, reports from now on.
    if (next.state.phase === "stopped") this.close();
    else if (next.report) this.report();
  }

  private tick(): void {
    const control = this.options.control;
    if (control) this.sample(control.passed());
    this.apply({ type: "tick" });
    if (performance.now() - this.reportedAt >= this.reportIntervalMs) this.report();
  }

  /** Barriers passed without a message: the step time is the time since the last sample over the steps since. */
  private sample(passed: number): void {
    if (passed < 0 || (this.newest && passed <= this.newest.step)) return;
    const now = performance.now();
    if (this.newest) {
      this.stepMs.push((now - this.newest.at) / (passed - this.newest.step));
      if (this.stepMs.length > STEP_HISTORY) this.stepMs.shift();
    }
    this.newest = { step: passed, at: now };
    this.apply({ type: "passed", step: passed });
    this.options.onStep?.(passed);
  }

  /** The first process at a new barrier marks the step's end. */
  private timeStep(step: number): void {
    const now = performance.now();
    if (this.newest && step <= this.newest.step) return;
    if (this.newest && step === this.newest.step + 1) {
      this.stepMs.push(now - this.newest.at);
      if (this.stepMs.length > STEP_HISTORY) this.stepMs.shift();
    }
    this.newest = { step, at: now };
    this.options.onStep?.(step);
  }

  private report(): void {
    const hold = this.hold;
    if (!hold || this.timer === null) return;
    this.reportedAt = performance.now();
    const report = { worker: this.worker, generation: hold.generation, step: lastStep(hold), stepMs: median(this.stepMs), hold: holdReport(hold) };
    this.client.report(report, Math.max(this.reportIntervalMs, 4 * TICK_MS)).then(
      (order) => {
        if (this.failing !== null) this.log.info(() => "the controller answers again");
        this.failing = null;
        this.obey(order);
      },
      (error: unknown) => this.reportFailed(error),
    );
  }

  private reportFailed(error: unknown): void {
    const why =
      error instanceof ControllerTimeoutError
        ? "the controller does not answer: training goes on, and no migration starts until it does"
        : error instanceof ControllerError
          ? `the controller refused a report: ${error.message}`
          : null;
    if (why === null || why === this.failing) return;
    this.failing = why;
    this.log.warn(() => why);
  }
}

function median(values: readonly number[]): number | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

/**
 * One worker with one process, for launchers written in TypeScript (and tests): `barrier(step)`
 * after every iteration answers on this host, and waits only while the job stops for a move.
 * After `migrate-out`, send the checkpoint, then call `barrier` again with the same step for
 * the outcome: `stop` once the move committed, `continue` if it rolled back.
 */
export class WorkerClient {
  private readonly agent: HostAgent;

  constructor(client: ControllerClient, worker: WorkerIdentity, parallelism: Parallelism, options: Omit<AgentOptions, "ranks" | "onSend"> = {}) {
    this.agent = new HostAgent(client, worker, parallelism, { ...options, ranks: 1 });
  }

  get worker(): WorkerIdentity {
    return this.agent.worker;
  }

  get parallelism(): Parallelism {
    return this.agent.parallelism;
  }

  get assignment(): Assignment | null {
    return this.agent.assignment;
  }

  /** The stop this worker holds at or trains toward, if the controller named one. */
  get stop(): { readonly id: string; readonly step: number } | null {
    return this.agent.stop;
  }

  register(timeoutMs?: number): Promise<Assignment> {
    return this.agent.register(timeoutMs);
  }

  async barrier(step: number): Promise<Directive> {
    // A loop that trains synchronously would otherwise never let the controller's orders in.
    await new Promise((resolve) => setImmediate(resolve));
    let answer: Answer;
    if (this.agent.phase === "saving") {
      const outcome = this.agent.saved(0);
      this.agent.sent();
      answer = await outcome;
    } else {
      answer = await this.agent.arrive(0, step);
    }
    if (answer.kind === "error") throw new Error(answer.message);
    return answer;
  }

  /** Stops reporting. */
  close(): void {
    this.agent.close();
  }
}
