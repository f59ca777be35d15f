import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { formatZodError } from "../../sdk/contract/errors.ts";

/**
 * What the example worker reports, one JSON line per event in `<dir>/<job>.jsonl`. Lines of
 * a few hundred bytes appended with O_APPEND do not interleave, so every incarnation of every
 * worker of a job (sources and replacements alike) can share the file.
 */
const base = { job: z.string(), group: z.int().min(0), host: z.int().min(0), pid: z.int() };

export const WorkerEventSchema = z.discriminatedUnion("event", [
  /** A replacement loaded the staged checkpoint; `step` is the first iteration it runs. */
  z.strictObject({ ...base, event: z.literal("resumed"), migration: z.string(), step: z.int().min(0), loadSeconds: z.number() }),
  /** The source packed its state and wrote it into the destination's staging buffer. */
  z.strictObject({
    ...base,
    event: z.literal("sent"),
    migration: z.string(),
    to: z.int().min(0),
    step: z.int().min(0),
    bytes: z.int(),
    packSeconds: z.number(),
    sendSeconds: z.number(),
    transport: z.enum(["tcp", "rdma"]),
  }),
  /** The move rolled back after the source sent; it keeps training where it was. */
  z.strictObject({ ...base, event: z.literal("kept"), migration: z.string(), step: z.int().min(0) }),
  /** The last iteration ran; `digest` is the CRC32C of the whole state. */
  z.strictObject({ ...base, event: z.literal("finished"), step: z.int().min(0), digest: z.string() }),
]);
export type WorkerEvent = z.infer<typeof WorkerEventSchema>;

export function appendEvent(dir: string, event: WorkerEvent): void {
  appendFileSync(join(dir, `${event.job}.jsonl`), `${JSON.stringify(event)}\n`);
}

/** Every event of a job so far; a line that does not parse names its place. */
export function readEvents(text: string, source: string): WorkerEvent[] {
  return text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line, index) => {
      const parsed = WorkerEventSchema.safeParse(JSON.parse(line));
      if (!parsed.success) throw new Error(formatZodError(`${source}:${index + 1}`, parsed.error));
      return parsed.data;
    });
}
