"""Triton's words for config.pbtxt syntax errors.

Python's protobuf text-format parser and the C++ one Triton uses reject the same text, but word
most errors differently (``Couldn't parse integer: four`` where C++ says ``Expected integer, got:
four``). :func:`triton_parse_problem` rewrites a Python error into the C++ message, so a log can be
grepped for what Triton prints.

Several C++ messages name the token the parser stopped at, or the field it was reading, where the
Python ones do not. These are recovered from the text at the position Python reported, with a
small tokenizer that splits text as C++'s does (``-1`` is two tokens there, one in Python). Where
that cannot be done reliably (no token starts at that position, the token is one C++'s tokenizer
would itself complain about, the field cannot be told) the Python message is kept, minus the
``'<source line>': `` prefix Python's tokenizer puts on its messages. A Python message with no
C++ counterpart passes through unchanged. Line and column stay those Python reported: C++ can
put the same error one token away, and counts a tab as up to 8 columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor

from stubhost.config.model_config_pb2 import ModelConfig

# text_format prefixes its messages with "line:column : " when it knows the position.
_POSITION_PREFIX = re.compile(r"^\d+:\d+ : ")

_IDENT, _INT, _FLOAT, _STRING, _SYMBOL, _END = "identifier", "integer", "float", "string", "symbol", "end"


class ParseProblem(NamedTuple):
    """A parse error in C++ protobuf's words, at the 1-based position Python reported (or None)."""

    message: str
    line: int | None
    column: int | None


@dataclass(frozen=True)
class _Token:
    text: str
    kind: str
    line: int  # 1-based, lines split at "\n" as text_format splits them
    column: int  # 1-based index of the token's first character in its line
    clean: bool  # False where C++'s tokenizer would report an error of its own for this token


def triton_parse_problem(error: Exception, text: str) -> ParseProblem:
    """Triton's wording for ``error``, which ``text_format.Parse(text, ModelConfig())`` raised.

    ``error`` is a ``text_format.ParseError``, or the ``ValueError`` the upb backend raises when an
    enum number outside int32 is stored (that one carries no position; it is looked up).
    """
    if not isinstance(error, text_format.ParseError):
        return _unpositioned_value_error(str(error), text)
    line, column = error.GetLine(), error.GetColumn()
    message = _POSITION_PREFIX.sub("", str(error)) if line is not None else str(error)
    if line is None or column is None:
        return ParseProblem(message, line, column)
    lines = text.split("\n")
    # Errors of Python's tokenizer start with "'<the line it is on>': " ("''" once past the end).
    prefixed = False
    for shown in (lines[line - 1] if 0 < line <= len(lines) else "", ""):
        if message.startswith(f"'{shown}': "):
            message, prefixed = message[len(shown) + 4 :], True
            break
    tokens = list(_tokenize(lines))
    translated = _translate(message, prefixed, tokens, _index_at(tokens, line, column))
    return ParseProblem(translated if translated is not None else message, line, column)


# ---- the translations --------------------------------------------------------------------------

_DUPLICATE = re.compile(r'Message type "[\w.]+" should not have multiple "(?P<field>\w+)" fields\.')
_ONEOF = re.compile(r'(?P<kept>Field "\w+" is specified along with field "\w+", another member of oneof "\w+")'
                    r' for message type "[\w.]+"\.')
_NO_FIELD = re.compile(r'Message type "[\w.]+" has no field named "(?P<name>.*)"\.')
_EXPECTED_SYMBOL = re.compile(r'Expected "(?P<symbol>.)"\.')
_NO_ENUM_VALUE = re.compile(r'Enum type "[\w.]+" has no value named (?P<value>.*)\.')
_OUT_OF_RANGE = re.compile(r"Value out of range: (?P<value>-?\d+)")
_BOOL_TRUE_FALSE = ("true", "True", "t", "false", "False", "f")  # what C++ takes, besides 0 and 1
_SIGNED = (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64)
_UNSIGNED = (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64)


def _translate(message: str, prefixed: bool, tokens: list[_Token], at: int | None) -> str | None:
    """The C++ message for a Python one, or None to keep the Python one."""
    if match := _DUPLICATE.fullmatch(message):
        return f'Non-repeated field "{match["field"]}" is specified multiple times.'
    if match := _ONEOF.fullmatch(message):
        return f"{match['kept']}."
    if not prefixed and message in ('Expected "}".', 'Expected ">".'):
        # Python raises these only at the end of the text, where C++ looks for the next field's name.
        return "Expected identifier, got: "
    if at is None or not tokens[at].clean:
        return None
    token = tokens[at]
    if match := _NO_FIELD.fullmatch(message):
        # Python takes a number as a field name; C++ wants an identifier there.
        return f"Expected identifier, got: {token.text}" if token.kind == _INT and token.text == match["name"] else None
    if not prefixed:
        return None
    if match := _EXPECTED_SYMBOL.fullmatch(message):
        return f'Expected "{match["symbol"]}", found "{token.text}".'
    if message.startswith("Expected identifier or number, got ") or message == "Expected identifier.":
        return f"Expected identifier, got: {token.text}"
    if message.startswith("Expected string but found: "):
        return f"Expected string, got: {token.text}" if token.kind != _STRING else None
    if match := _NO_ENUM_VALUE.fullmatch(message):
        return _enum_message(match["value"], tokens, at)
    if message == 'Expected "true" or "false".':
        return _bool_message(tokens, at)
    if message.startswith("Couldn't parse integer: "):
        return _integer_message(tokens, at, out_of_range=None)
    if match := _OUT_OF_RANGE.fullmatch(message):
        value = _int_value(match["value"])
        return _integer_message(tokens, at, out_of_range=value) if value is not None else None
    if message.startswith(("Couldn't parse float: ", "Invalid octal float: ")):
        return _double_problem(_after_minus(tokens, at))
    return None


def _enum_message(value: str, tokens: list[_Token], at: int) -> str | None:
    token = tokens[at]
    if token.text != value:
        return None
    if token.kind == _IDENT:
        field = _value_field(tokens, at)
        if field is None or field.cpp_type != FieldDescriptor.CPPTYPE_ENUM:
            return None
        return f'Unknown enumeration value of "{value}" for field "{field.name}".'
    if token.kind in (_STRING, _FLOAT, _END) or (token.kind == _SYMBOL and token.text != "-"):
        return f"Expected integer or identifier, got: {token.text}"
    return None


def _bool_message(tokens: list[_Token], at: int) -> str | None:
    token = tokens[at]
    if token.kind == _IDENT:
        field = _value_field(tokens, at)
        if token.text in _BOOL_TRUE_FALSE or field is None or field.cpp_type != FieldDescriptor.CPPTYPE_BOOL:
            return None
        return f'Invalid value for boolean field "{field.name}". Value: "{token.text}".'
    if token.kind == _INT:
        # C++ reads an integer there as 0 or 1; Python takes only the spellings "0" and "1".
        value = _int_value(token.text)
        return f"Integer out of range ({token.text})" if value is not None and value > 1 else None
    return f"Expected identifier, got: {token.text}"


def _integer_message(tokens: list[_Token], at: int, out_of_range: int | None) -> str | None:
    """For an integer field: "Couldn't parse integer" (``out_of_range`` None) or "Value out of range"."""
    token = tokens[at]
    if token.text == "-":
        # Python's token is "-123"; C++ reads "-" first, which only a signed field takes.
        field = _value_field(tokens, at)
        if field is None or field.cpp_type not in _SIGNED + _UNSIGNED:
            return None
        if field.cpp_type in _UNSIGNED:
            return "Expected integer, got: -"
        token = tokens[at + 1]
        if not token.clean:
            return None
        if out_of_range is not None:
            return f"Integer out of range ({token.text})" if _int_value(token.text) == -out_of_range else None
        return f"Expected integer, got: {token.text}" if token.kind != _INT else None
    if out_of_range is not None:
        return f"Integer out of range ({token.text})" if _int_value(token.text) == out_of_range else None
    return f"Expected integer, got: {token.text}" if token.kind != _INT else None


def _double_problem(token: _Token | None) -> str | None:
    """What C++ says of ``token`` as the value of a float field (after any "-"), None if it takes it."""
    if token is None or not token.clean:
        return None
    if token.kind == _INT:
        decimal = not re.match(r"0[xX0-9]", token.text)
        return None if decimal else f"Expect a decimal number, got: {token.text}"
    if token.kind == _FLOAT:
        return None
    if token.kind == _IDENT:
        lowered = token.text.lower()
        return None if lowered in ("inf", "infinity", "nan") else f"Expected double, got: {lowered}"
    return f"Expected double, got: {token.text}"


def _after_minus(tokens: list[_Token], at: int) -> _Token | None:
    return tokens[at + 1] if tokens[at].text == "-" and tokens[at].kind == _SYMBOL else tokens[at]


def _unpositioned_value_error(message: str, text: str) -> ParseProblem:
    """upb refused an enum number outside int32 as it was stored: find it, and say it as C++ does."""
    match = _OUT_OF_RANGE.fullmatch(message)
    if match:
        tokens = list(_tokenize(text.split("\n")))
        for index, field in _walk(tokens):
            token = tokens[index]
            if field is None or field.cpp_type != FieldDescriptor.CPPTYPE_ENUM or index == 0:
                continue
            if tokens[index - 1].text not in (":", "[", ","):
                continue
            number = _after_minus(tokens, index)
            if number is None or number.kind != _INT or not number.clean:
                continue
            value = _int_value(number.text)
            if value is not None and (value > 2**31 - 1 if number is token else value > 2**31):
                return ParseProblem(f"Integer out of range ({number.text})", token.line, token.column)
    return ParseProblem(message, None, None)


# ---- where the error is: tokens and fields -----------------------------------------------------


def _value_field(tokens: list[_Token], at: int) -> FieldDescriptor | None:
    """The field whose value ``tokens[at]`` is (``name: <here>`` or inside ``name: [..., <here>``)."""
    if at == 0 or tokens[at - 1].text not in (":", "[", ","):
        return None
    for index, field in _walk(tokens):
        if index == at:
            return field
    return None


def _walk(tokens: list[_Token]) -> Iterator[tuple[int, FieldDescriptor | None]]:
    """Each token's index with the field last named in the message it is in.

    Follows the braces from ``ModelConfig`` down. The text before a Python parse error was well
    formed, so a field name is an identifier followed by ``:``, ``{``, ``<`` or ``[``. Stops where
    the text does not fit the schema.
    """
    types = [ModelConfig.DESCRIPTOR]
    fields: list[FieldDescriptor | None] = [None]
    for index, token in enumerate(tokens):
        yield index, fields[-1]
        if token.kind == _SYMBOL and token.text in ("{", "<"):
            field = fields[-1]
            if field is None or field.message_type is None:
                return
            types.append(field.message_type)
            fields.append(None)
        elif token.kind == _SYMBOL and token.text in ("}", ">"):
            if len(types) == 1:
                return
            types.pop()
            fields.pop()
        elif token.kind == _IDENT and index + 1 < len(tokens) and tokens[index + 1].text in (":", "{", "<", "["):
            fields[-1] = types[-1].fields_by_name.get(token.text)


def _index_at(tokens: list[_Token], line: int, column: int) -> int | None:
    """The token starting at ``line``:``column``; the end token for a position after the last one."""
    for index, token in enumerate(tokens):
        if (token.line, token.column) == (line, column):
            return index
    last = tokens[-2] if len(tokens) > 1 else None
    if last is None or (line, column) >= (last.line, last.column + len(last.text)):
        return len(tokens) - 1
    return None


def _int_value(text: str) -> int | None:
    """The value of a C++ integer token (decimal, 0x hex, 0 octal); None if Python cannot say."""
    try:
        if re.fullmatch(r"0[0-7]+", text):
            return int(text, 8)
        return int(text, 0)
    except ValueError:  # e.g. more digits than Python's int() converts
        return None


# ---- a tokenizer that splits as C++ protobuf's io::Tokenizer does ---------------------------------

_WHITESPACE = re.compile(r"(?:[ \t\r\v\f]+|#.*)+")  # C++'s whitespace; "#" comments run to the line end
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER_START = re.compile(r"[0-9]|\.[0-9]")
_HEX = re.compile(r"0[xX][0-9A-Fa-f]*")
_OCTAL = re.compile(r"0(?=[0-9])[0-7]*(?P<bad>[89][0-9]*)?")
_DECIMAL = re.compile(r"[0-9]*(?P<dot>\.[0-9]*)?(?P<exp>[eE][+-]?(?P<digits>[0-9]*))?(?P<f>[fF])?")
_ESCAPE = re.compile(r"""\\(?:[abfnrtv\\?'"]|[0-7]|x[0-9A-Fa-f]|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8})""")


def _tokenize(lines: list[str]) -> Iterator[_Token]:
    """The C++ tokens of ``lines``, ending with an empty end token."""
    for number, line in enumerate(lines, start=1):
        position = 0
        while True:
            space = _WHITESPACE.match(line, position)
            if space:
                position = space.end()
            if position >= len(line):
                break
            start = position
            char = line[position]
            if identifier := _IDENTIFIER.match(line, position):
                position, kind, clean = identifier.end(), _IDENT, True
            elif _NUMBER_START.match(line, position):
                position, kind, clean = _number_end(line, position)
            elif char in "\"'":
                position, kind, clean = _string_end(line, position)
            else:
                # Control characters and non-ASCII ones draw an error from C++'s tokenizer.
                position, kind, clean = position + 1, _SYMBOL, " " < char < "\x7f"
            yield _Token(line[start:position], kind, number, start + 1, clean)
    yield _Token("", _END, len(lines), len(lines[-1]) + 1, True)


def _number_end(line: str, start: int) -> tuple[int, str, bool]:
    """End, kind and cleanness of the number at ``start`` (C++ ``Tokenizer::ConsumeNumber``)."""
    kind, clean = _INT, True
    if hex_number := _HEX.match(line, start):
        end, clean = hex_number.end(), hex_number.end() > start + 2  # '"0x" must be followed by hex digits.'
    elif octal := _OCTAL.match(line, start):
        end, clean = octal.end(), not octal["bad"]  # "Numbers starting with leading zero must be in octal."
    else:
        number = _DECIMAL.match(line, start)
        assert number is not None  # it matches the empty string at worst
        end = number.end()
        if number["dot"] is not None or number["exp"] is not None or number["f"] is not None:
            kind = _FLOAT
        clean = number["exp"] is None or bool(number["digits"])  # '"e" must be followed by exponent.'
    following = line[end : end + 1]
    if following and (following in "._" or (following.isascii() and following.isalpha())):
        clean = False  # "Need space between number and identifier." and the like
    return end, kind, clean


def _string_end(line: str, start: int) -> tuple[int, str, bool]:
    """End, kind and cleanness of the quoted string at ``start`` (C++ ``Tokenizer::ConsumeString``)."""
    quote, position, clean = line[start], start + 1, True
    while position < len(line):
        char = line[position]
        if char == quote:
            return position + 1, _STRING, clean
        if char == "\\":
            escape = _ESCAPE.match(line, position)
            if escape is None:
                clean = False  # "Invalid escape sequence in string literal."
                position += 2
            else:
                position = escape.end()
            continue
        position += 1
    return len(line), _STRING, False  # "String literals cannot cross line boundaries."
