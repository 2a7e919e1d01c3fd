// ESLint for the playground's own scripts (app/playground/*.js; the vendored ones are checked by their makers) and
// the JS client with its tests (clients/js/src, clients/js/test).
// .ci/run installs the pinned versions into .ci/node_modules and runs it; nothing of it ships or runs in the server.
import js from "@eslint/js";
import globals from "globals";

export default [
  js.configs.recommended,
  {
    files: ["**/*.js"],
    languageOptions: { ecmaVersion: 2024, sourceType: "module", globals: { ...globals.browser } },
    linterOptions: { reportUnusedDisableDirectives: "error" },
    rules: {
      eqeqeq: ["error", "always", { null: "ignore" }],
      "no-var": "error",
      "prefer-const": "error",
      "no-shadow": "error",
      "no-implicit-coercion": "error",
      "no-unused-vars": ["error", { varsIgnorePattern: "^_", argsIgnorePattern: "^_" }],
      "no-restricted-properties": [
        "error",
        { property: "innerHTML", message: "server text is set as textContent, or as nodes DOMPurify returns" },
        { property: "outerHTML", message: "server text is set as textContent, or as nodes DOMPurify returns" },
      ],
      "no-restricted-syntax": ["error", { selector: "CallExpression[callee.property.name='insertAdjacentHTML']", message: "no HTML from strings" }],
    },
  },
  {
    // the JS client (clients/js/src/index.js, copied byte for byte) runs in Node too
    files: ["**/client.js", "**/index.js"],
    languageOptions: { globals: { ...globals.browser, ...globals.node } },
    rules: { "no-shadow": "off" },
  },
  {
    // the JS client's own tests (`node --test`, tests/test_client_js.py): Node's globals
    files: ["clients/js/test/**/*.js"],
    languageOptions: { globals: { ...globals.node } },
  },
];
