import { PassThrough } from "node:stream";
import { main } from "../../cli/main.ts";

export interface CliResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs the `monkeytree` CLI in-process with captured output. */
export async function runCli(...argv: string[]): Promise<CliResult> {
  const out = new PassThrough();
  const err = new PassThrough();
  const chunks = { out: [] as Buffer[], err: [] as Buffer[] };
  out.on("data", (c: Buffer) => chunks.out.push(c));
  err.on("data", (c: Buffer) => chunks.err.push(c));
  const code = await main(argv, { out, err });
  return { code, stdout: Buffer.concat(chunks.out).toString(), stderr: Buffer.concat(chunks.err).toString() };
}
