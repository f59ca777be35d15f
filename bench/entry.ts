import { UsageError } from "../cli/io.ts";

/**
 * A benchmark's command line: `--help` or `-h` prints its usage, whatever else is given; a bad
 * flag prints the reason and the usage and exits 2; otherwise `run` gets the parsed options and
 * returns the exit code.
 */
export async function benchMain<Options>(
  name: string,
  help: string,
  parse: (argv: string[]) => Options,
  run: (options: Options) => Promise<number> | number,
): Promise<void> {
  const argv = process.argv.slice(2);
  if (argv.includes("--help") || argv.includes("-h")) {
    process.stdout.write(`${help}\n`);
    return;
  }
  let options: Options;
  try {
    options = parse(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`bench:${name}: ${error.message}\n${help}\n`);
    process.exitCode = 2;
    return;
  }
  process.exitCode = await run(options);
}
