// The one DOM helper: elements built with createElement and text nodes, never from HTML strings, so
// no value from the API can become markup.

/**
 * A new element: `h("a", {href: "#/"}, "Batches")`. Attributes: `class`, `on<event>` handlers, `true` for
 * an empty attribute; null, undefined and false are left out, as are such children.
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  const shown = children.flat().filter((child) => child !== null && child !== undefined && child !== false);
  element.append(...shown.map((child) => (child instanceof Node ? child : String(child))));
  return element;
}
