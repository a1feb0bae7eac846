//! Exact rational arithmetic and the recursive-descent parser of Countdown answers.
//!
//! Grammar (whitespace between tokens is ignored):
//!
//! ```text
//! expr    := term (('+' | '-') term)*
//! term    := operand (('*' | '/') operand)*
//! operand := '-'? primary
//! primary := INTEGER | '(' expr ')'
//! ```
//!
//! The body is at most `MAX_BODY_BYTES` long and parentheses nest at most `MAX_DEPTH`
//! deep, so the recursion (four frames per level) and the work are bounded.

/// An exact rational `num / den`: `den > 0`, `gcd(|num|, den) = 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rational {
    num: i128,
    den: i128,
}

/// Why an arithmetic step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArithError {
    /// Division by an exact zero.
    DivisionByZero,
    /// A numerator or denominator left i128.
    Overflow,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rational {
    /// The integer `n`.
    pub(crate) fn int(n: i128) -> Rational {
        Rational { num: n, den: 1 }
    }

    /// `num / den` reduced, or an error for `den = 0` or overflow.
    pub(crate) fn new(num: i128, den: i128) -> Result<Rational, ArithError> {
        if den == 0 {
            return Err(ArithError::DivisionByZero);
        }
        let (num, den) = if den < 0 {
            (
                num.checked_neg().ok_or(ArithError::Overflow)?,
                den.checked_neg().ok_or(ArithError::Overflow)?,
            )
        } else {
            (num, den)
        };
        let g = gcd(num.unsigned_abs(), den.unsigned_abs());
        // g divides den > 0, so g >= 1 and fits i128 (g <= den).
        let g = i128::try_from(g).map_err(|_| ArithError::Overflow)?;
        Ok(Rational {
            num: num / g,
            den: den / g,
        })
    }

    /// The value as an integer, when it is one.
    pub(crate) fn as_integer(self) -> Option<i128> {
        (self.den == 1).then_some(self.num)
    }

    pub(crate) fn add(self, o: Rational) -> Result<Rational, ArithError> {
        let ov = ArithError::Overflow;
        let a = self.num.checked_mul(o.den).ok_or(ov)?;
        let b = o.num.checked_mul(self.den).ok_or(ov)?;
        let d = self.den.checked_mul(o.den).ok_or(ov)?;
        Rational::new(a.checked_add(b).ok_or(ov)?, d)
    }

    pub(crate) fn neg(self) -> Result<Rational, ArithError> {
        Ok(Rational {
            num: self.num.checked_neg().ok_or(ArithError::Overflow)?,
            den: self.den,
        })
    }

    pub(crate) fn sub(self, o: Rational) -> Result<Rational, ArithError> {
        self.add(o.neg()?)
    }

    pub(crate) fn mul(self, o: Rational) -> Result<Rational, ArithError> {
        let ov = ArithError::Overflow;
        Rational::new(
            self.num.checked_mul(o.num).ok_or(ov)?,
            self.den.checked_mul(o.den).ok_or(ov)?,
        )
    }

    pub(crate) fn div(self, o: Rational) -> Result<Rational, ArithError> {
        if o.num == 0 {
            return Err(ArithError::DivisionByZero);
        }
        let ov = ArithError::Overflow;
        Rational::new(
            self.num.checked_mul(o.den).ok_or(ov)?,
            self.den.checked_mul(o.num).ok_or(ov)?,
        )
    }
}

/// Why a body that uses only the allowed characters is not a valid expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseFault {
    /// Not a sentence of the grammar (unbalanced parentheses, a dangling operator, two
    /// numbers in a row, `--1`, ...).
    Syntax,
    /// Parentheses nest deeper than [`super::MAX_DEPTH`].
    TooDeep,
    /// A division by zero.
    DivisionByZero,
    /// A literal or an intermediate value does not fit i128.
    Overflow,
}

impl From<ArithError> for ParseFault {
    fn from(e: ArithError) -> ParseFault {
        match e {
            ArithError::DivisionByZero => ParseFault::DivisionByZero,
            ArithError::Overflow => ParseFault::Overflow,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// A literal; `None` when its digits overflow i128.
    Num(Option<i128>),
    Plus,
    Minus,
    Star,
    Slash,
    Open,
    Close,
}

/// Splits a body of allowed characters into tokens (whitespace dropped).
fn tokens(body: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        let t = match c {
            '+' => Token::Plus,
            '-' => Token::Minus,
            '*' => Token::Star,
            '/' => Token::Slash,
            '(' => Token::Open,
            ')' => Token::Close,
            d if d.is_ascii_digit() => {
                let mut v = Some(i128::from(d as u8 - b'0'));
                while let Some(&e) = chars.peek() {
                    if !e.is_ascii_digit() {
                        break;
                    }
                    chars.next();
                    let digit = i128::from(e as u8 - b'0');
                    v = v
                        .and_then(|v| v.checked_mul(10))
                        .and_then(|v| v.checked_add(digit));
                }
                Token::Num(v)
            }
            // Whitespace (the caller admits nothing else).
            _ => continue,
        };
        out.push(t);
    }
    out
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    max_depth: usize,
    literals: Vec<i128>,
}

impl Parser {
    fn peek(&self) -> Option<Token> {
        self.tokens.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<Token> {
        let t = self.peek();
        self.pos += 1;
        t
    }

    fn expr(&mut self, depth: usize) -> Result<Rational, ParseFault> {
        self.level(depth, [Token::Plus, Token::Minus], Self::term)
    }

    fn term(&mut self, depth: usize) -> Result<Rational, ParseFault> {
        self.level(depth, [Token::Star, Token::Slash], Self::operand)
    }

    /// One left-associative precedence level: `next (op next)*` for the two operators `ops`.
    fn level(
        &mut self,
        depth: usize,
        ops: [Token; 2],
        next: fn(&mut Self, usize) -> Result<Rational, ParseFault>,
    ) -> Result<Rational, ParseFault> {
        let mut v = next(self, depth)?;
        while let Some(op) = self.peek().filter(|t| ops.contains(t)) {
            self.pos += 1;
            let r = next(self, depth)?;
            v = match op {
                Token::Plus => v.add(r)?,
                Token::Minus => v.sub(r)?,
                Token::Star => v.mul(r)?,
                // Only the four operators pass the filter: this is `/`.
                _ => v.div(r)?,
            };
        }
        Ok(v)
    }

    fn operand(&mut self, depth: usize) -> Result<Rational, ParseFault> {
        if self.peek() == Some(Token::Minus) {
            self.pos += 1;
            return Ok(self.primary(depth)?.neg()?);
        }
        self.primary(depth)
    }

    fn primary(&mut self, depth: usize) -> Result<Rational, ParseFault> {
        match self.bump() {
            Some(Token::Num(Some(n))) => {
                self.literals.push(n);
                Ok(Rational::int(n))
            }
            Some(Token::Num(None)) => Err(ParseFault::Overflow),
            Some(Token::Open) => {
                if depth >= self.max_depth {
                    return Err(ParseFault::TooDeep);
                }
                let v = self.expr(depth + 1)?;
                match self.bump() {
                    Some(Token::Close) => Ok(v),
                    _ => Err(ParseFault::Syntax),
                }
            }
            _ => Err(ParseFault::Syntax),
        }
    }
}

/// Parses and evaluates `body` (only digits, `+ - * /`, parentheses and whitespace);
/// returns its exact value and its integer literals in order of appearance.
pub(crate) fn evaluate(body: &str, max_depth: usize) -> Result<(Rational, Vec<i128>), ParseFault> {
    let mut p = Parser {
        tokens: tokens(body),
        pos: 0,
        max_depth,
        literals: Vec::new(),
    };
    let v = p.expr(0)?;
    if p.pos != p.tokens.len() {
        return Err(ParseFault::Syntax);
    }
    Ok((v, p.literals))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> Result<Rational, ParseFault> {
        evaluate(s, 64).map(|(v, _)| v)
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(val("1 + 2 * 3"), Ok(Rational::int(7)));
        assert_eq!(val("(1 + 2) * 3"), Ok(Rational::int(9)));
        assert_eq!(val("8 - 3 - 2"), Ok(Rational::int(3)));
        assert_eq!(val("8 / 4 / 2"), Ok(Rational::int(1)));
        assert_eq!(val("1 / 3 + 1 / 6"), Ok(Rational::new(1, 2).unwrap()));
        assert_eq!(val("-3 + 5"), Ok(Rational::int(2)));
        assert_eq!(val("2 * -3"), Ok(Rational::int(-6)));
        assert_eq!(val("-(2 + 3)"), Ok(Rational::int(-5)));
    }

    #[test]
    fn faults() {
        assert_eq!(val("1 +"), Err(ParseFault::Syntax));
        assert_eq!(val("(1 + 2"), Err(ParseFault::Syntax));
        assert_eq!(val("1 + 2)"), Err(ParseFault::Syntax));
        assert_eq!(val("1 2"), Err(ParseFault::Syntax));
        assert_eq!(val("--1"), Err(ParseFault::Syntax));
        assert_eq!(val("+1"), Err(ParseFault::Syntax));
        assert_eq!(val("()"), Err(ParseFault::Syntax));
        assert_eq!(val(""), Err(ParseFault::Syntax));
        assert_eq!(val("1 / (2 - 2)"), Err(ParseFault::DivisionByZero));
        assert_eq!(val(&"9".repeat(40)), Err(ParseFault::Overflow));
        let big = format!("{0} * {0} * {0}", "1".repeat(15));
        assert_eq!(val(&big), Err(ParseFault::Overflow));
        assert_eq!(
            evaluate("((1))", 1).map(|(v, _)| v),
            Err(ParseFault::TooDeep)
        );
        assert_eq!(evaluate("((1))", 2).map(|(v, _)| v), Ok(Rational::int(1)));
    }

    #[test]
    fn rational_normal_form() {
        assert_eq!(Rational::new(2, -4), Rational::new(-1, 2));
        assert_eq!(Rational::new(0, -5), Ok(Rational::int(0)));
        assert_eq!(Rational::new(i128::MIN, -1), Err(ArithError::Overflow));
        assert_eq!(Rational::new(1, 0), Err(ArithError::DivisionByZero));
    }
}
