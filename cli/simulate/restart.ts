import { z } from "zod";
import { InvalidInputError, readJsonFile } from "../../sdk/contract/errors.ts";

/**
 * What `monkeytree simulate --restart-from` reads of `npm run bench:migrate -- --json`: each
 * row's overhead, the downtime a move costs beyond its bytes' own time. The simulator charges
 * those bytes as flows on the fabric, so the overhead is what it charges as the restart.
 */
export const MigrationBenchSchema = z.object({
  rows: z
    .array(
      z.object({
        job: z.string().max(64),
        bytesPerHost: z.number().int().positive(),
        // null where every run of the row failed: JSON has no NaN.
        overheadS: z.number().nullable(),
      }),
    )
    .min(1)
    .max(1_000)
    .readonly(),
});

/** The restart cost to simulate: the largest overhead among the bench's rows, in seconds (at least 0). */
export function restartFromBench(path: string): number {
  const source = `--restart-from ${path}`;
  const bench = readJsonFile(path, source, MigrationBenchSchema, "write it with `npm run bench:migrate -- --json > FILE`");
  const measured = bench.rows.flatMap((row) => (row.overheadS === null ? [] : [row.overheadS]));
  if (measured.length === 0)
    throw new InvalidInputError(source, [{ path: "rows", message: "no row measured an overhead (every run failed); run the bench again" }]);
  return Math.max(0, ...measured);
}
