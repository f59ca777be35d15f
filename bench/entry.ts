import { UsageError } from "../cli/io.ts";

/**
 * A benchmark's command line: `--help` prints its usage; a bad flag prints the reason and the
 * usage and exits 2; otherwise `run` gets the parsed options and returns the exit code.
 */
export async function benchMain<Options extends { readonly help: boolean }>(
  name: string,
  help: string,
  parse: (argv: string[]) => Options,
  run: (options: Options) => Promise<number> | number,
): Promise<void> {
  let options: Options;
  try {
    options = parse(process.argv.slice(2));
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`bench:${name}: ${error.message}\n${help}\n`);
    process.exitCode = 2;
    return;
  }
  if (options.help) {
    process.stdout.write(`${help}\n`);
    return;
  }
  process.exitCode = await run(options);
}
