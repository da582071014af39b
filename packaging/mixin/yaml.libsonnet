// Prometheus rule files as YAML, fields in the order Prometheus documents them. jsonnet's own
// std.manifestYamlDoc escapes strings a character at a time (minutes for these files): here a
// string is single-quoted, or a literal block where it spans lines.
local fields = ['record', 'alert', 'expr', 'for', 'labels', 'annotations'];
// `s` as a YAML scalar ending its line; a block's lines are indented by `pad`.
local scalar(s, pad) =
  local lines = std.split(s, '\n');
  if std.length(lines) > 1
  then '|\n' + std.join('', [pad + l + '\n' for l in lines[:std.length(lines) - 1]])
  else "'" + std.strReplace(s, "'", "''") + "'\n";
local field(k, v, pad) =
  if std.isObject(v)
  then k + ':\n' + std.join('', [pad + '  ' + f + ': ' + scalar(v[f], pad + '    ') for f in std.objectFields(v)])
  else k + ': ' + scalar(v, pad + '  ');
local rule(r) =
  local present = [k for k in fields if std.objectHas(r, k)];
  '      - ' + std.join('        ', [field(k, r[k], '        ') for k in present]);
{
  // A rule file of `groups`.
  rules(groups)::
    'groups:\n' + std.join('', [
      '  - name: ' + scalar(g.name, '') + '    rules:\n' + std.join('', [rule(r) for r in g.rules])
      for g in groups.groups
    ]),
}
