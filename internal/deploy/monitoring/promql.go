package monitoring

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"space/internal/errkind"
)

// CheckExpr and Metrics read PromQL lexically: Prometheus's own parser
// (github.com/prometheus/prometheus/promql/parser) comes in the module of
// the whole Prometheus server, and adding it upgrades dependencies SPACE
// shares with Kubernetes' and Helm's packages (go-openapi, x/exp). The
// check is strict enough to catch what a hand edit breaks: brackets that
// do not pair, a function PromQL lacks, a malformed label matcher or
// regular expression, a bad range, two operands without an operator
// between them or an operator without an operand, grouping where PromQL
// takes none. It accepts Grafana's variables ($name, ${name},
// $__rate_interval) where a string or a range may be. It is stricter than
// Prometheus in one place: a range needs a unit ([5m], not [300]).

// functions are PromQL's functions.
var functions = words(`abs absent absent_over_time avg_over_time ceil changes clamp clamp_max
	clamp_min count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp floor
	histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
	histogram_sum hour idelta increase irate label_join label_replace last_over_time ln log10 log2
	mad_over_time max_over_time min_over_time minute month predict_linear present_over_time
	quantile_over_time rate resets round scalar sgn sort sort_by_label sort_by_label_desc sort_desc sqrt
	stddev_over_time stdvar_over_time sum_over_time time timestamp vector year`)

// aggregations are PromQL's aggregation operators, which take by or
// without.
var aggregations = words(`sum avg min max count group stddev stdvar topk bottomk quantile
	count_values limitk limit_ratio`)

// setOps are the keywords that are binary operators.
var setOps = words("and or unless")

// words is the set of the whitespace-separated words of s.
func words(s string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(s) {
		m[w] = true
	}
	return m
}

// token kinds.
const (
	tIdent = iota
	tNumber
	tString
	tVar // a Grafana variable
	tOp
	tPunct // ( ) { } [ ] ,
)

type token struct {
	kind int
	text string
}

// ops are PromQL's operators, longest first.
var ops = []string{"==", "!=", ">=", "<=", "=~", "!~", "+", "-", "*", "/", "%", "^", ">", "<", "="}

func lex(expr string) ([]token, error) {
	var out []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && (isIdentStart(expr[j]) || isDigit(expr[j]) || expr[j] == ':') {
				j++
			}
			out = append(out, token{tIdent, expr[i:j]})
			i = j
		case isDigit(c) || (c == '.' && i+1 < len(expr) && isDigit(expr[i+1])):
			// A number, or a duration (5m, 1h30m) in a range.
			j := i
			for j < len(expr) && (isDigit(expr[j]) || expr[j] == '.' || isIdentStart(expr[j]) || expr[j] == 'e') {
				j++
			}
			out = append(out, token{tNumber, expr[i:j]})
			i = j
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d: %w", i, errkind.InvalidArgument)
			}
			out = append(out, token{tString, expr[i : j+1]})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d: %w", i, errkind.InvalidArgument)
				}
				j += k + 1
			} else {
				for j < len(expr) && (isIdentStart(expr[j]) || isDigit(expr[j])) {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("a lone $ at %d: %w", i, errkind.InvalidArgument)
			}
			out = append(out, token{tVar, expr[i:j]})
			i = j
		case strings.ContainsRune("(){}[],", rune(c)):
			out = append(out, token{tPunct, string(c)})
			i++
		default:
			k := slices.IndexFunc(ops, func(op string) bool { return strings.HasPrefix(expr[i:], op) })
			if k < 0 {
				return nil, fmt.Errorf("unexpected %q at %d: %w", c, i, errkind.InvalidArgument)
			}
			out = append(out, token{tOp, ops[k]})
			i += len(ops[k])
		}
	}
	return out, nil
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// checker walks an expression's tokens.
type checker struct {
	toks    []token
	pos     int
	metrics []string
}

func (c *checker) peek() (token, bool) {
	if c.pos < len(c.toks) {
		return c.toks[c.pos], true
	}
	return token{}, false
}

func (c *checker) is(kind int, text string) bool {
	t, ok := c.peek()
	return ok && t.kind == kind && t.text == text
}

func (c *checker) errorf(format string, args ...any) error {
	return fmt.Errorf("at token %d: "+format+": %w", append([]any{c.pos}, append(args, errkind.InvalidArgument)...)...)
}

// CheckExpr checks expr lexically (see above); errors wrap
// errkind.InvalidArgument.
func CheckExpr(expr string) error {
	_, err := check(expr)
	return err
}

// Metrics returns the families (Family) of the SPACE metrics, names
// starting space_, that expr selects, each once, in order of appearance.
// It checks expr as CheckExpr does.
func Metrics(expr string) ([]string, error) {
	ms, err := check(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if f := Family(m); strings.HasPrefix(f, "space_") && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, nil
}

// check checks expr and returns the metric names it selects.
func check(expr string) ([]string, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, fmt.Errorf("empty expression: %w", errkind.InvalidArgument)
	}
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	c := &checker{toks: toks}
	if err := c.expr(); err != nil {
		return nil, fmt.Errorf("%q: %w", expr, err)
	}
	if t, ok := c.peek(); ok {
		return nil, fmt.Errorf("%q: %w", expr, c.errorf("unexpected %q", t.text))
	}
	return c.metrics, nil
}

// expr reads operands joined by binary operators up to the end, or to
// the ")" or "," that closes the enclosing group.
func (c *checker) expr() error {
	for {
		// Unary signs.
		for c.is(tOp, "-") || c.is(tOp, "+") {
			c.pos++
		}
		if err := c.operand(); err != nil {
			return err
		}
		// Postfix: a range, offset, or an aggregation's by after its call.
		if err := c.postfix(); err != nil {
			return err
		}
		t, ok := c.peek()
		if !ok || (t.kind == tPunct && (t.text == ")" || t.text == ",")) {
			return nil
		}
		set := t.kind == tIdent && setOps[t.text]
		switch {
		case t.kind == tOp && t.text != "=" && t.text != "=~" && t.text != "!~":
			c.pos++
			if c.is(tIdent, "bool") {
				c.pos++
			}
		case set:
			c.pos++
		default:
			return c.errorf("%q where an operator belongs", t.text)
		}
		if err := c.matching(set); err != nil {
			return err
		}
	}
}

// matching reads on/ignoring (labels) and group_left/group_right (labels)
// after a binary operator; set operators (set) match many-to-many and
// take no group_left or group_right.
func (c *checker) matching(set bool) error {
	for _, kw := range [][]string{{"on", "ignoring"}, {"group_left", "group_right"}} {
		if t, ok := c.peek(); ok && t.kind == tIdent && slices.Contains(kw, t.text) {
			if set && kw[0] == "group_left" {
				return c.errorf("%s after a set operator", t.text)
			}
			c.pos++
			if c.is(tPunct, "(") || kw[0] == "on" {
				if err := c.labelList(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// operand reads a number, a string, a parenthesized expression, a call,
// an aggregation or a selector.
func (c *checker) operand() error {
	t, ok := c.peek()
	if !ok {
		return c.errorf("an operand is missing at the end")
	}
	switch {
	case t.kind == tNumber:
		if _, err := strconv.ParseFloat(t.text, 64); err != nil {
			return c.errorf("bad number %q", t.text)
		}
		c.pos++
		return nil
	case t.kind == tString:
		c.pos++
		return nil
	case t.kind == tPunct && t.text == "(":
		c.pos++
		if err := c.expr(); err != nil {
			return err
		}
		return c.want(")")
	case t.kind == tPunct && t.text == "{":
		return c.matchers()
	case t.kind != tIdent:
		return c.errorf("%q where an operand belongs", t.text)
	}
	c.pos++
	name := t.text
	if aggregations[name] {
		grouped := c.is(tIdent, "by") || c.is(tIdent, "without")
		if grouped {
			c.pos++
			if err := c.labelList(); err != nil {
				return err
			}
		}
		if !c.is(tPunct, "(") {
			return c.errorf("aggregation %s without arguments", name)
		}
		if err := c.args(); err != nil {
			return err
		}
		// The grouping may follow the arguments instead: sum(x) by (y).
		if c.is(tIdent, "by") || c.is(tIdent, "without") {
			if grouped {
				return c.errorf("aggregation %s grouped twice", name)
			}
			c.pos++
			return c.labelList()
		}
		return nil
	}
	if c.is(tPunct, "(") {
		if !functions[name] {
			return c.errorf("no PromQL function %s", name)
		}
		return c.args()
	}
	if setOps[name] || name == "by" || name == "without" || name == "on" || name == "ignoring" || name == "bool" || name == "offset" {
		return c.errorf("keyword %s where an operand belongs", name)
	}
	c.metrics = append(c.metrics, name)
	if c.is(tPunct, "{") {
		return c.matchers()
	}
	return nil
}

// args reads a call's parenthesized, comma-separated arguments.
func (c *checker) args() error {
	if err := c.want("("); err != nil {
		return err
	}
	if c.is(tPunct, ")") {
		c.pos++
		return nil
	}
	for {
		if err := c.expr(); err != nil {
			return err
		}
		if c.is(tPunct, ",") {
			c.pos++
			continue
		}
		return c.want(")")
	}
}

// postfix reads a range [DURATION] and offset DURATION.
func (c *checker) postfix() error {
	if c.is(tPunct, "[") {
		c.pos++
		t, ok := c.peek()
		if !ok {
			return c.errorf("unterminated range")
		}
		switch t.kind {
		case tNumber:
			if _, err := parseDuration(t.text); err != nil {
				return c.errorf("range %q: %v", t.text, err)
			}
		case tVar:
		default:
			return c.errorf("range %q", t.text)
		}
		c.pos++
		if err := c.want("]"); err != nil {
			return err
		}
	}
	if c.is(tIdent, "offset") {
		c.pos++
		t, ok := c.peek()
		if !ok || (t.kind != tNumber && t.kind != tVar) {
			return c.errorf("offset without a duration")
		}
		c.pos++
	}
	return nil
}

// labelList reads (label, ...).
func (c *checker) labelList() error {
	if err := c.want("("); err != nil {
		return err
	}
	for !c.is(tPunct, ")") {
		t, ok := c.peek()
		if !ok || t.kind != tIdent {
			return c.errorf("a label name is missing in a list")
		}
		c.pos++
		if c.is(tPunct, ",") {
			c.pos++
		} else if !c.is(tPunct, ")") {
			return c.errorf("a comma is missing in a label list")
		}
	}
	c.pos++
	return nil
}

// matchers reads {label OP "value", ...}; a regular expression must
// compile (Grafana's variables in it are left as they are, which RE2
// reads as anchors).
func (c *checker) matchers() error {
	if err := c.want("{"); err != nil {
		return err
	}
	for !c.is(tPunct, "}") {
		name, ok := c.peek()
		if !ok || name.kind != tIdent {
			return c.errorf("a label name is missing in a matcher")
		}
		c.pos++
		op, ok := c.peek()
		if !ok || op.kind != tOp || !slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) {
			return c.errorf("label %s without a matcher's operator", name.text)
		}
		c.pos++
		v, ok := c.peek()
		if !ok || v.kind != tString {
			return c.errorf("label %s without a quoted value", name.text)
		}
		c.pos++
		if op.text == "=~" || op.text == "!~" {
			s, err := unquote(v.text)
			if err != nil {
				return c.errorf("label %s: value %s: %v", name.text, v.text, err)
			}
			if _, err := regexp.Compile("^(?:" + s + ")$"); err != nil {
				return c.errorf("label %s: regular expression %s: %v", name.text, v.text, err)
			}
		}
		if c.is(tPunct, ",") {
			c.pos++
		} else if !c.is(tPunct, "}") {
			return c.errorf("a comma is missing between matchers")
		}
	}
	c.pos++
	return nil
}

func unquote(s string) (string, error) {
	if strings.HasPrefix(s, "'") {
		s = `"` + strings.ReplaceAll(strings.ReplaceAll(s[1:len(s)-1], `"`, `\"`), `\'`, `'`) + `"`
	}
	return strconv.Unquote(s)
}

func (c *checker) want(p string) error {
	if !c.is(tPunct, p) {
		t, _ := c.peek()
		return c.errorf("%q missing (found %q)", p, t.text)
	}
	c.pos++
	return nil
}
