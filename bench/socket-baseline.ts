// The plain-socket baseline (baseline_socket.py: one TCP stream, no framing, no checksums, from
// and into the same /dev/shm staging buffers) that the transfer benchmarks compare against, and
// the line-per-JSON child processes the benchmarks drive.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createInterface, type Interface } from "node:readline";
import { z } from "zod";
import type { StagingBuffer } from "../native/index.ts";

const BASELINE = new URL("./baseline_socket.py", import.meta.url).pathname;

/** A child speaking one JSON object per stdout line. */
export class Peer {
  readonly #child: ChildProcess;
  readonly #lines: AsyncIterator<string>;
  readonly #stderr: string[] = [];

  constructor(command: string[]) {
    const [file, ...args] = command;
    this.#child = spawn(file ?? "", args, { stdio: ["ignore", "pipe", "pipe"] });
    this.#child.stderr?.on("data", (data: Buffer) => this.#stderr.push(data.toString()));
    const lines: Interface = createInterface({ input: this.#child.stdout! });
    this.#lines = lines[Symbol.asyncIterator]();
  }

  async next<T>(schema: z.ZodType<T>): Promise<T> {
    const line = await this.#lines.next();
    if (line.done) {
      if (this.#child.exitCode === null) await once(this.#child, "exit");
      throw new Error(`peer exited (${this.#child.exitCode}) without answering: ${this.#stderr.join("").trim()}`);
    }
    return schema.parse(JSON.parse(line.value));
  }

  kill(): void {
    if (this.#child.exitCode === null) this.#child.kill("SIGKILL");
  }
}

export const secondsSchema = z.object({ seconds: z.number().positive() });

export interface Namespaces {
  name: string;
  /** Command prefix placing a process on the sending / receiving side. */
  sender: string[];
  receiver: string[];
  receiverHost: string;
}

export const LOOPBACK: Namespaces = { name: "loopback", sender: [], receiver: [], receiverHost: "127.0.0.1" };

/** Seconds the plain-socket baseline takes to move `size` bytes from `source` to `destination` across `ns`. */
export async function baselineRun(ns: Namespaces, source: StagingBuffer, destination: StagingBuffer, size: number): Promise<number> {
  const receiver = new Peer([...ns.receiver, "python3", BASELINE, "recv", destination.name, ns.receiverHost, String(size)]);
  try {
    const { port } = await receiver.next(z.object({ port: z.number().int() }));
    const sender = new Peer([...ns.sender, "python3", BASELINE, "send", source.name, ns.receiverHost, String(port), String(size)]);
    try {
      const sent = await sender.next(secondsSchema);
      await receiver.next(secondsSchema);
      return sent.seconds;
    } finally {
      sender.kill();
    }
  } finally {
    receiver.kill();
  }
}
