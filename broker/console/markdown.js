// Agent output is untrusted: Markdown is turned into HTML by marked, and that HTML goes
// through DOMPurify before it touches the page (no script, no event handler, no style, no
// javascript: or data: link). The page's Content-Security-Policy is the second fence.
import { Marked } from "./vendor/marked-18.2.1.esm.js";
import DOMPurify from "./vendor/purify-3.5.0.es.mjs";

const marked = new Marked({ gfm: true, breaks: false, async: false });

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "object", "embed"],
  FORBID_ATTR: ["style", "srcset", "action", "formaction"],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
  if (node.tagName === "IMG") node.setAttribute("loading", "lazy");
});

// Set once, not passed per call: DOMPurify parses a config it is given on every call, and a
// replayed session renders hundreds of messages at once. It returns the sanitized nodes
// themselves (a fragment), which the page adopts, rather than their HTML to parse again.
DOMPurify.setConfig({ ...PURIFY, RETURN_DOM_FRAGMENT: true });

/** The sanitized rendering of a Markdown text, as a DocumentFragment. */
export function markdownFragment(text) {
  return DOMPurify.sanitize(marked.parse(text));
}

/** Put the sanitized rendering of `text` into `element`. */
export function renderMarkdown(element, text) {
  element.replaceChildren(markdownFragment(text));
}
