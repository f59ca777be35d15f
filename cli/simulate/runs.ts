import { availableParallelism, totalmem } from "node:os";
import { Worker } from "node:worker_threads";
import { InvalidInputError, type InputIssue } from "../../sdk/contract/errors.ts";
import { nodeArgs } from "../../sdk/contract/paths.ts";
import { createPlanner, type Planner } from "../../controller/planner/plan/index.ts";
import { simulateSystem, systemSpec, type SimConfigInput, type SimJob, type SystemName, type SystemRun } from "../../controller/simulator/index.ts";

/**
 * A simulate command's runs (one system on one trace) are independent and each is synchronous
 * work of seconds to minutes, so they run side by side in worker threads, one per core. Each
 * thread loads its own planner; results come back in the runs' order, so reports, CSV files and
 * charts are the same whatever the number of threads.
 */

/** One run: a system on a trace, with a variant's settings. */
export interface RunRequest {
  readonly index: number;
  readonly system: SystemName;
  readonly variant: string | null;
  readonly load: number | null;
  readonly config: SimConfigInput;
  readonly jobs: readonly SimJob[];
  /** Keep the fragmentation samples for charts (they are many). */
  readonly samples: boolean;
}

/** A time in hours and a value: one point of a fragmentation chart. */
export type Point = [number, number];

export interface RunResult {
  readonly index: number;
  readonly run: SystemRun;
  /** Its rows of jobs.csv, plans.csv and fragmentation.csv. */
  readonly rows: CsvLines;
  /** Over time: the busiest rack's degree and the total, when samples were asked for. */
  readonly busiest: Point[];
  readonly total: Point[];
  /** Wall-clock seconds the run took in its thread. */
  readonly seconds: number;
}

/** A run's lines of jobs.csv, plans.csv and fragmentation.csv. */
export interface CsvLines {
  readonly jobs: readonly string[];
  readonly plans: readonly string[];
  readonly fragmentation: readonly string[];
}

/** One run's CSV rows, gathered during the run. */
class CsvRows implements CsvLines {
  readonly jobs: string[] = [];
  readonly plans: string[] = [];
  readonly fragmentation: string[] = [];
  readonly #prefix: string;
  constructor(system: SystemName, variant: string | null, load: number | null) {
    this.#prefix = `${system},${variant ?? ""},${load ?? ""}`;
  }
  job(j: { id: string; arrival: number; start: number; finish: number; ideal: number; slowdown: number; moves: number }): void {
    this.jobs.push(`${this.#prefix},${j.id},${j.arrival},${j.start},${j.finish},${j.ideal},${j.slowdown},${j.moves}`);
  }
  plan(p: { time: number; status: string; moves: number; solveMs: number }): void {
    this.plans.push(`${this.#prefix},${p.time},${p.status},${p.moves},${p.solveMs}`);
  }
  sample(s: { time: number; maxRack: number; meanRack: number; fragmentedGroups: number; total: number }): void {
    this.fragmentation.push(`${this.#prefix},${s.time},${s.maxRack},${s.meanRack},${s.fragmentedGroups},${s.total}`);
  }
}

/** How often a run reports its finished jobs: often enough for a progress bar, rarely enough to cost nothing. */
const PROGRESS_MS = 250;

/** Runs one request on this thread; `progress` hears the jobs finished so far. */
export function simulateRun(request: RunRequest, planner: Planner | undefined, progress: (done: number) => void): RunResult {
  const started = performance.now();
  const rows = new CsvRows(request.system, request.variant, request.load);
  const busiest: Point[] = [];
  const total: Point[] = [];
  let done = 0;
  let told = started;
  const run = simulateSystem(request.jobs, request.config, request.system, planner, {
    jobDone: (job) => {
      rows.job(job);
      done++;
      if (performance.now() - told < PROGRESS_MS) return;
      told = performance.now();
      progress(done);
    },
    planned: (event) => rows.plan(event),
    sample: (sample) => {
      rows.sample(sample);
      if (!request.samples) return;
      busiest.push([sample.time / 3600, sample.maxRack]);
      total.push([sample.time / 3600, sample.total]);
    },
  });
  return { index: request.index, run, rows, busiest, total, seconds: (performance.now() - started) / 1000 };
}

/** What a run thread says: a run's progress, its result, or why it failed. */
export type ThreadMessage =
  | { readonly kind: "progress"; readonly index: number; readonly done: number }
  | { readonly kind: "result"; readonly result: RunResult }
  | { readonly kind: "invalid"; readonly index: number; readonly source: string; readonly issues: readonly InputIssue[] }
  | { readonly kind: "error"; readonly index: number; readonly message: string };

export interface RunListener {
  /** A run's jobs finished so far (from time to time). */
  progress(index: number, done: number): void;
  /** A run is done; called in the runs' order, each once every run before it is done. */
  finished(result: RunResult): Promise<void> | void;
}

/**
 * Memory a thread may need: its planner's heap on the largest clusters (`DEFAULT_PLAN_HEAP_MIB`
 * bounds the controller's) besides HiGHS and a run's state.
 */
const THREAD_MEMORY_BYTES = 2 * 2 ** 30;

/** The most threads `--threads` may ask for: far past the cores of any one machine, and each thread holds a planner and a run's state. */
export const MAX_THREADS = 1_024;

/** Threads by default: one per core, at most one per run and one per 2 GiB of the machine's memory. */
export function defaultThreads(runs: number): number {
  return Math.max(1, Math.min(availableParallelism(), runs, Math.floor(totalmem() / THREAD_MEMORY_BYTES)));
}

const RUN_THREAD = nodeArgs(import.meta.url, "./run-thread");

/**
 * Runs every request, on `threads` worker threads (1: on this thread, between which the event
 * loop turns so that progress and output get out). Rejects with the first failure: an
 * `InvalidInputError` as such, anything else as an Error naming the run.
 */
export async function runAll(requests: readonly RunRequest[], threads: number, listener: RunListener): Promise<void> {
  const ordered = new InOrder(listener);
  if (threads <= 1) {
    const planner = requests.some((r) => systemSpec(r.system).migrate) ? await createPlanner() : undefined;
    for (const request of requests) {
      await ordered.add(simulateRun(request, planner, (done) => listener.progress(request.index, done)));
      await new Promise((resolve) => setImmediate(resolve));
    }
    return;
  }
  await new Pool(requests, Math.min(threads, requests.length), listener, ordered).run();
}

/** Hands results to the listener in the runs' order. */
class InOrder {
  readonly #waiting = new Map<number, RunResult>();
  #next = 0;
  constructor(private readonly listener: RunListener) {}

  async add(result: RunResult): Promise<void> {
    this.#waiting.set(result.index, result);
    for (let r = this.#waiting.get(this.#next); r; r = this.#waiting.get(this.#next)) {
      this.#waiting.delete(this.#next++);
      await this.listener.finished(r);
    }
  }
}

/** Worker threads, each given the next run as it finishes one. */
class Pool {
  #next = 0;
  readonly #threads = new Set<Worker>();
  #chain: Promise<void> = Promise.resolve();

  constructor(
    private readonly requests: readonly RunRequest[],
    private readonly size: number,
    private readonly listener: RunListener,
    private readonly ordered: InOrder,
  ) {}

  run(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let running = 0;
      const fail = (error: Error) => {
        for (const thread of this.#threads) void thread.terminate();
        this.#threads.clear();
        reject(error);
      };
      const give = (thread: Worker): void => {
        const request = this.requests[this.#next++];
        if (request) {
          thread.postMessage(request);
          return;
        }
        this.#threads.delete(thread);
        void thread.terminate();
        if (--running === 0) this.#chain.then(resolve, fail);
      };
      for (let i = 0; i < this.size; i++) {
        const [file, ...argv] = RUN_THREAD;
        const thread = new Worker(file!, { argv });
        this.#threads.add(thread);
        running++;
        thread.on("message", (message: ThreadMessage) => {
          switch (message.kind) {
            case "progress":
              this.listener.progress(message.index, message.done);
              break;
            case "invalid":
              fail(new InvalidInputError(message.source, message.issues));
              break;
            case "error":
              fail(new Error(`${this.describe(message.index)}: ${message.message}`));
              break;
            case "result":
              this.#chain = this.#chain.then(() => this.ordered.add(message.result));
              this.#chain.catch(fail);
              give(thread);
          }
        });
        thread.on("error", (error) => fail(new Error(`a simulation thread failed: ${error.message}`)));
        thread.on("exit", (code) => {
          if (this.#threads.has(thread)) fail(new Error(`a simulation thread exited (${code}) before its runs were done`));
        });
        give(thread);
      }
    });
  }

  describe(index: number): string {
    const r = this.requests[index];
    return r ? `${r.system}${r.variant === null ? "" : ` ${r.variant}`}${r.load === null ? "" : ` at load ${r.load}`}` : `run ${index}`;
  }
}
