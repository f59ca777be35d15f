import { Worker } from "node:worker_threads";
import type { Cluster } from "../planner/model/cluster.ts";
import type { Plan } from "../planner/plan/planner.ts";
import { nodeArgs } from "../../sdk/contract/paths.ts";

/**
 * Planning off the controller's event loop. A plan may use its whole time limit (seconds);
 * on the event loop every barrier, heartbeat and status request would wait for it. The
 * planner runs in a worker thread instead, one plan at a time, and the controller keeps
 * answering. A thread that crashes, runs out of memory or overruns its plan's time limit by
 * `graceMs` fails that plan (the controller logs it and plans again later) and is replaced
 * by a fresh one at the next plan.
 */

/** How the controller plans: one plan at a time, answered asynchronously. */
export interface PlanRunner {
  /** Plans the fewest moves for `cluster`; rejects when the planner fails or cannot answer. */
  plan(cluster: Cluster, timeLimitMs: number): Promise<Plan>;
  /** Stops planning; a plan in flight rejects with `PlanThreadError`. */
  close(): Promise<void>;
}

/** What the controller sends the thread. */
export interface PlanRequest {
  readonly id: number;
  readonly cluster: Cluster;
  readonly timeLimitMs: number;
}

/** What the thread answers: the plan, or the planner's error message. */
export type PlanAnswer = { readonly id: number; readonly plan: Plan } | { readonly id: number; readonly error: string };

/** What the thread says once, when it has loaded the planner and takes requests. */
export const PLANNER_READY = { ready: true } as const;

/** The thread could not answer: it crashed, hung, or the controller stopped. */
export class PlanThreadError extends Error {
  override readonly name = "PlanThreadError";
  readonly code = "plan_thread";
}

export interface PlanThreadOptions {
  /** Node arguments of the thread's module (its file, then its argv); the planner's by default. */
  readonly entry?: readonly string[];
  /** How long past its time limit a plan may run before the thread is stopped. */
  readonly graceMs?: number;
  /** How long a new thread may take to load the planner before it counts as hung. */
  readonly startMs?: number;
  /** The thread's heap bound: past it the thread dies, and the controller lives on. */
  readonly maxHeapMiB?: number;
}

/** The planner's time per event: a plan within it, improved until it or proved optimal. */
export const DEFAULT_PLAN_TIME_LIMIT_MS = 2_000;

/** A planner past its time limit returns within moments; a loaded machine may take a few seconds. */
export const DEFAULT_PLAN_GRACE_MS = 10_000;
/**
 * Starting a thread (compiling the planner from source under tsx, loading HiGHS) takes a second
 * on an idle machine and minutes under emulation; it is not counted against a plan's limit.
 */
export const DEFAULT_PLAN_START_MS = 10 * 60_000;
/** The worst snapshot within the limits plans in under 1 GB. */
export const DEFAULT_PLAN_HEAP_MIB = 2_048;

/**
 * The planner thread's nice value (Linux): under contention for cores it yields to the
 * controller's event loop, so barriers stay fast while a plan runs; a plan that gets less of a
 * core still returns its best plan at its time limit.
 */
export const PLANNER_NICE = 19;

const PLANNER_THREAD = nodeArgs(import.meta.url, "./plan-thread-main");

interface InFlight {
  readonly id: number;
  readonly timeLimitMs: number;
  readonly resolve: (plan: Plan) => void;
  readonly reject: (error: Error) => void;
  /** Until the thread is ready, its start deadline; then the plan's. */
  hung: NodeJS.Timeout;
}

export class PlanThread implements PlanRunner {
  private thread: Worker | null = null;
  private ready = false;
  private inFlight: InFlight | null = null;
  private nextId = 1;
  private closed = false;

  constructor(private readonly options: PlanThreadOptions = {}) {}

  plan(cluster: Cluster, timeLimitMs: number): Promise<Plan> {
    if (this.closed) return Promise.reject(new PlanThreadError("the planner is closed"));
    if (this.inFlight) return Promise.reject(new PlanThreadError(`plan #${this.inFlight.id} is still in flight; the planner takes one plan at a time`));
    const thread = this.thread ?? this.start();
    const id = this.nextId++;
    return new Promise<Plan>((resolve, reject) => {
      const hung = this.ready ? this.planDeadline(id, timeLimitMs) : this.startDeadline();
      this.inFlight = { id, timeLimitMs, resolve, reject, hung };
      const request: PlanRequest = { id, cluster, timeLimitMs };
      thread.postMessage(request);
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    this.fail(new PlanThreadError("the controller stopped while a plan was in flight"), false);
    const thread = this.thread;
    this.thread = null;
    await thread?.terminate();
  }

  private planDeadline(id: number, timeLimitMs: number): NodeJS.Timeout {
    const limitMs = timeLimitMs + (this.options.graceMs ?? DEFAULT_PLAN_GRACE_MS);
    return setTimeout(
      () =>
        this.fail(
          new PlanThreadError(`the planner thread did not answer plan #${id} within ${limitMs} ms (its time limit is ${timeLimitMs} ms); it was stopped`),
          true,
        ),
      limitMs,
    );
  }

  private startDeadline(): NodeJS.Timeout {
    const startMs = this.options.startMs ?? DEFAULT_PLAN_START_MS;
    return setTimeout(() => this.fail(new PlanThreadError(`the planner thread did not load the planner within ${startMs} ms; it was stopped`), true), startMs);
  }

  /** The thread loaded the planner: a plan waiting for it gets its own deadline from now. */
  private started(): void {
    this.ready = true;
    const inFlight = this.inFlight;
    if (!inFlight) return;
    clearTimeout(inFlight.hung);
    inFlight.hung = this.planDeadline(inFlight.id, inFlight.timeLimitMs);
  }

  private start(): Worker {
    const [file, ...argv] = this.options.entry ?? PLANNER_THREAD;
    if (!file) throw new PlanThreadError("the planner thread's entry names no file");
    const thread = new Worker(file, { argv, resourceLimits: { maxOldGenerationSizeMb: this.options.maxHeapMiB ?? DEFAULT_PLAN_HEAP_MIB } });
    // A thread between plans must not keep the process alive; a plan in flight has its timer.
    thread.unref();
    // A thread already stopped (it hung) may still report; only the current one's events count.
    this.ready = false;
    thread.on("message", (answer: PlanAnswer | typeof PLANNER_READY) => this.thread === thread && ("ready" in answer ? this.started() : this.answered(answer)));
    thread.on("error", (error) => this.thread === thread && this.fail(new PlanThreadError(`the planner thread crashed: ${error.message}`), true));
    thread.on("exit", (code) => {
      if (this.thread !== thread) return;
      this.thread = null;
      this.fail(new PlanThreadError(`the planner thread exited with code ${code}`), false);
    });
    this.thread = thread;
    return thread;
  }

  private answered(answer: PlanAnswer): void {
    const inFlight = this.inFlight;
    // An answer to a plan that already failed (it overran, then answered) is dropped.
    if (!inFlight || answer.id !== inFlight.id) return;
    this.inFlight = null;
    clearTimeout(inFlight.hung);
    if ("plan" in answer) inFlight.resolve(answer.plan);
    else inFlight.reject(new Error(answer.error));
  }

  /** Fails the plan in flight, if any; `stop` also ends the thread, so the next plan gets a fresh one. */
  private fail(error: PlanThreadError, stop: boolean): void {
    const inFlight = this.inFlight;
    this.inFlight = null;
    if (inFlight) {
      clearTimeout(inFlight.hung);
      inFlight.reject(error);
    }
    if (stop && this.thread) {
      const thread = this.thread;
      this.thread = null;
      void thread.terminate();
    }
  }
}
