// The TaskBrowser's task list: a listbox that the keyboard moves through.
//
// JupyterLab takes the arrow keys of a focused <select> for its own notebook shortcuts; this
// list marks itself `data-lm-suppress-shortcuts`, so ArrowUp/ArrowDown/Home/End move the
// selection here, as in any list. The model holds `options` ([label, id] pairs) and `value`
// (the selected id, or null); picking a task sets `value`, which opens it.

function render({ model, el }) {
  const list = document.createElement("div");
  list.className = "toolkit-task-list";
  list.setAttribute("role", "listbox");
  list.setAttribute("tabindex", "0");
  list.setAttribute("aria-label", "tasks");
  list.setAttribute("data-lm-suppress-shortcuts", "true");
  list.style.height = `${model.get("rows") * 1.5}em`;
  el.appendChild(list);

  const choose = (id) => {
    if (id !== model.get("value")) {
      model.set("value", id);
      model.save_changes();
    }
  };

  const draw = () => {
    list.replaceChildren();
    const value = model.get("value");
    for (const [label, id] of model.get("options")) {
      const row = document.createElement("div");
      row.className = "toolkit-task-list-option";
      row.setAttribute("role", "option");
      row.setAttribute("aria-selected", String(id === value));
      row.dataset.id = String(id);
      row.textContent = label;
      row.addEventListener("click", () => {
        list.focus();
        choose(id);
      });
      list.appendChild(row);
      if (id === value) {
        row.scrollIntoView({ block: "nearest" });
      }
    }
  };

  list.addEventListener("keydown", (event) => {
    const ids = model.get("options").map(([, id]) => id);
    if (ids.length === 0) {
      return;
    }
    const at = ids.indexOf(model.get("value"));
    const moves = {
      ArrowDown: Math.min(at + 1, ids.length - 1),
      ArrowUp: at < 0 ? 0 : Math.max(at - 1, 0),
      Home: 0,
      End: ids.length - 1,
    };
    if (event.key in moves) {
      event.preventDefault();
      event.stopPropagation();
      choose(ids[moves[event.key]]);
    }
  });

  model.on("change:options", draw);
  model.on("change:value", draw);
  draw();
}

export default { render };
