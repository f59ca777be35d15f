import type { Io } from "../io.ts";

/** What progress shows of a run: its name and its jobs. */
export interface RunLabel {
  readonly label: string;
  readonly jobs: number;
}

/**
 * A simulate command's progress on stderr: a line as each run finishes, in the runs' order, and
 * on a terminal, a status line with the runs in flight and how far each has come.
 */
export class Progress {
  readonly #tty: boolean;
  /** Jobs finished of each run in flight. */
  readonly #running = new Map<number, number>();
  #finished = 0;

  constructor(
    private readonly io: Io,
    private readonly runs: readonly RunLabel[],
  ) {
    this.#tty = (io.err as { isTTY?: boolean }).isTTY === true;
  }

  progress(index: number, done: number): void {
    this.#running.set(index, done);
    this.#draw();
  }

  finished(index: number, seconds: number): void {
    const run = this.runs[index]!;
    this.#running.delete(index);
    this.#finished++;
    this.io.err.write(`${this.#tty ? "\r\x1b[K" : ""}[${index + 1}/${this.runs.length}] ${run.label}: ${run.jobs} jobs in ${seconds.toFixed(1)} s\n`);
    this.#draw();
  }

  done(): void {
    if (this.#tty) this.io.err.write("\r\x1b[K");
  }

  #draw(): void {
    if (!this.#tty) return;
    const flight = [...this.#running].map(([index, done]) => `${this.runs[index]!.label} ${Math.floor((100 * done) / Math.max(1, this.runs[index]!.jobs))}%`);
    this.io.err.write(`\r\x1b[K${this.#finished}/${this.runs.length} runs done${flight.length ? `; ${flight.join(", ")}` : ""}`);
  }
}
