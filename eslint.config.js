import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["node_modules/", "native/build/", ".scratch/", "dist/", ".venv/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      // Library code reports through return values, errors and the logger, never the console.
      "no-console": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_" }],
    },
  },
  {
    // Type-aware: a promise nobody awaits or handles loses its rejection, and a switch over a
    // union that misses a member silently does nothing for it.
    files: ["**/*.ts"],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/switch-exhaustiveness-check": ["error", { considerDefaultExhaustiveForUnions: true }],
    },
  },
  {
    // A function one can hold in one's head; a test's describe block is a list, not a function.
    files: ["**/*.ts"],
    ignores: ["test/**"],
    rules: { "max-lines-per-function": ["error", { max: 80, skipBlankLines: true, skipComments: true }] },
  },
  {
    files: ["bin/**/*.js", "examples/**/*.js", "**/*.mjs"],
    languageOptions: { globals: { process: "readonly", Buffer: "readonly", setTimeout: "readonly", URL: "readonly" } },
  },
);
