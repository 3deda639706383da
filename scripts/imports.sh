#!/bin/sh
# The import graph of the crate's top-level modules, from the source text alone: every
# `crate::NAME` path (`use crate::{a, b::c}` groups included) outside comments, in every file
# below src/NAME (or src/NAME.rs). Prints one `from -> to` line per arrow, then checks:
#   - no forbidden arrow (the stages only look back; see docs/ARCHITECTURE.md):
#       vocab, tools, beneath, pipe, child -> anything;  userns -> anything but beneath
#       config  -> anything but vocab and tools
#       eval    -> graph, spec, runtime, session, image, cli
#       spec    -> runtime, image, session, cli
#       runtime -> image, session, cli
#       anything but main/lib -> cli
#   - no cycle among the arrows.
# Arrows still to be removed are listed, each with its reason, in scripts/imports.allow; they
# are printed as `(allowed)` and left out of both checks. An allowed arrow that no longer
# exists is an error too, so the list only shrinks.
#
# Usage: scripts/imports.sh [--dot]     (--dot: print the graph for graphviz instead)
# Exit status: 0 when clean, 1 on a forbidden arrow, a cycle or a stale allowance.
set -eu
cd "$(dirname "$0")/.."
allow_file=scripts/imports.allow

# from -> to, one per line, sorted and unique.
arrows=$(
	find src -name '*.rs' ! -path 'src/bin/*' ! -name main.rs ! -name lib.rs | sort | while read -r f; do
		from=${f#src/}
		from=${from%%/*}
		from=${from%.rs}
		perl -0777 -ne '
			# Strings, characters and comments (doc comments too) go, in one left-to-right pass.
			s{(r(\#*)".*?"\2|"(?:[^"\\]|\\.)*"|\x27(?:[^\x27\\\n]|\\[^\x27]+)\x27)|//[^\n]*|/\*.*?\*/}{defined $1 ? "\"\"" : ""}gse;
			while (/crate::\{/g) {                # use crate::{a, b::{c}, d}
				my ($depth, $i, $name, $top) = (1, pos($_), "", 1);
				while ($depth > 0 && $i < length) {
					my $c = substr($_, $i++, 1);
					if ($c eq "{") { $depth++; $top = 0 if $depth > 1 }
					elsif ($c eq "}") { $depth--; }
					elsif ($c eq "," && $depth == 1) { $top = 1; next }
					if ($depth == 1 && $top && $c =~ /\w/) { $name .= $c }
					elsif ($name ne "") { print "$name\n"; $name = ""; $top = 0 }
				}
			}
			print "$1\n" while /crate::(\w+)/g;
		' "$f" | sort -u | while read -r to; do
			if [ "$to" != "$from" ] && { [ -e "src/$to.rs" ] || [ -d "src/$to" ]; }; then
				echo "$from $to"
			fi
		done
	done | sort -u
)

allowed() { # from to
	[ -f "$allow_file" ] && grep -Eq "^$1 -> $2( |$)" "$allow_file"
}

if [ "${1:-}" = "--dot" ]; then
	echo "digraph aisb {"
	echo "$arrows" | while read -r a b; do
		if allowed "$a" "$b"; then echo "  \"$a\" -> \"$b\" [style=dashed];"; else echo "  \"$a\" -> \"$b\";"; fi
	done
	echo "}"
	exit 0
fi

status=0
checked=""
nl='
'
for line in $(echo "$arrows" | tr ' ' ':'); do
	a=${line%%:*}
	b=${line#*:}
	if allowed "$a" "$b"; then
		echo "$a -> $b (allowed)"
		continue
	fi
	echo "$a -> $b"
	checked="$checked$a $b$nl"
	why=""
	case "$a:$b" in
	vocab:*) why="vocab imports nothing of aisb" ;;
	tools:*) why="tools (the tool-rule language) imports nothing of aisb" ;;
	beneath:*) why="beneath (paths below an untrusted root) imports nothing of aisb" ;;
	pipe:*) why="pipe (splice through a pipe) imports nothing of aisb" ;;
	child:*) why="child (a host command, bounded) imports nothing of aisb" ;;
	userns:beneath) ;;
	userns:*) why="userns (the subordinate-id map) imports nothing of aisb but beneath" ;;
	config:vocab | config:tools) ;;
	config:*) why="config imports nothing of aisb but vocab and tools" ;;
	eval:graph | eval:spec | eval:runtime | eval:session | eval:image | eval:cli) why="eval is pure: it describes, later stages realise and run" ;;
	spec:runtime | spec:image | spec:session | spec:cli) why="spec is a function of the realised plan" ;;
	runtime:image | runtime:session | runtime:cli) why="runtime only runs a spec" ;;
	*:cli) why="only main and lib call the command line" ;;
	esac
	if [ -n "$why" ]; then
		echo "error: forbidden arrow $a -> $b: $why" >&2
		status=1
	fi
done

# Every allowance must still be needed.
if [ -f "$allow_file" ]; then
	grep -E '^[a-z_]+ -> [a-z_]+' "$allow_file" | while read -r a _ b _; do
		if ! echo "$arrows" | grep -qx "$a $b"; then
			echo "error: $allow_file allows $a -> $b, which no longer exists: delete the line" >&2
			exit 1
		fi
	done || status=1
fi

# tsort reports a cycle on stderr (and, on some systems, still exits 0).
cycle=$(printf '%s' "$checked" | tsort 2>&1 >/dev/null || true)
if [ -n "$cycle" ]; then
	echo "error: the import graph has a cycle:" >&2
	echo "$cycle" >&2
	status=1
fi
exit $status
