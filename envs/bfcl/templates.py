"""Plain-English templates that turn a tool call into an instruction a user could give.

Every argument value appears verbatim (as its Python repr), so a small policy can copy it into
the call; an argument a template does not mention is appended as ``with name=value``.
"""

from __future__ import annotations

import string

from coevolve.records import ToolCall

TEMPLATES: dict[str, str] = {
    # GorillaFileSystem
    "cat": "show the contents of the file {file_name}",
    "cd": "go into the folder {folder}",
    "cp": "copy {source} to {destination}",
    "diff": "compare the files {file_name1} and {file_name2}",
    "du": "show the disk usage of the current directory",
    "echo": "write {content} into the file {file_name}",
    "find": "find files whose name contains {name} under {path}",
    "grep": "search the file {file_name} for lines containing {pattern}",
    "ls": "list the contents of the current directory",
    "mkdir": "create a directory named {dir_name}",
    "mv": "move {source} to {destination}",
    "pwd": "print the current working directory",
    "rm": "remove the file {file_name}",
    "rmdir": "remove the directory {dir_name}",
    "sort": "sort the lines of the file {file_name}",
    "tail": "show the last lines of the file {file_name}",
    "touch": "create an empty file named {file_name}",
    "wc": "count the lines, words or characters of the file {file_name}",
    # MathAPI
    "absolute_value": "compute the absolute value of {number}",
    "add": "add {a} and {b}",
    "divide": "divide {a} by {b}",
    "imperial_si_conversion": "convert {value} from {unit_in} to {unit_out}",
    "logarithm": "compute the logarithm of {value} in base {base} with precision {precision}",
    "max_value": "find the largest of {numbers}",
    "mean": "compute the mean of {numbers}",
    "min_value": "find the smallest of {numbers}",
    "multiply": "multiply {a} by {b}",
    "percentage": "compute what percentage {part} is of {whole}",
    "power": "raise {base} to the power {exponent}",
    "round_number": "round {number}",
    "si_unit_conversion": "convert {value} from {unit_in} to {unit_out}",
    "square_root": "compute the square root of {number} with precision {precision}",
    "standard_deviation": "compute the standard deviation of {numbers}",
    "subtract": "subtract {b} from {a}",
    "sum_values": "sum the numbers {numbers}",
    # MessageAPI
    "add_contact": "add {user_name} as a new contact",
    "delete_message": "delete the latest message sent to {receiver_id}",
    "get_message_stats": "show my messaging statistics",
    "get_user_id": "look up the user id of {user}",
    "list_users": "list all users of the workspace",
    "message_get_login_status": "check whether I am logged in to the messaging app",
    "message_login": "log in to the messaging app as user {user_id}",
    "search_messages": "search my messages for {keyword}",
    "send_message": "send the message {message} to {receiver_id}",
    "view_messages_sent": "show the messages I have sent",
    # TwitterAPI
    "authenticate_twitter": "log in to Twitter as {username} with password {password}",
    "comment": "comment {comment_content} on tweet {tweet_id}",
    "follow_user": "follow {username_to_follow}",
    "get_tweet": "show tweet {tweet_id}",
    "get_tweet_comments": "show the comments of tweet {tweet_id}",
    "get_user_stats": "show the statistics of user {username}",
    "get_user_tweets": "show all tweets of {username}",
    "list_all_following": "list everyone I follow",
    "mention": "mention {mentioned_usernames} in tweet {tweet_id}",
    "post_tweet": "post a tweet saying {content}",
    "posting_get_login_status": "check whether I am logged in to Twitter",
    "retweet": "retweet tweet {tweet_id}",
    "search_tweets": "search tweets for {keyword}",
    "unfollow_user": "unfollow {username_to_unfollow}",
    # TicketAPI
    "close_ticket": "close ticket {ticket_id}",
    "create_ticket": "create a ticket titled {title}",
    "edit_ticket": "edit ticket {ticket_id} with the updates {updates}",
    "get_ticket": "show ticket {ticket_id}",
    "get_user_tickets": "list my tickets",
    "logout": "log out of the ticket system",
    "resolve_ticket": "resolve ticket {ticket_id} with the resolution {resolution}",
    "ticket_get_login_status": "check whether I am logged in to the ticket system",
    "ticket_login": "log in to the ticket system as {username} with password {password}",
}


def _fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def verbalize(call: ToolCall) -> str:
    """One instruction for one call, naming every argument value literally."""
    template = TEMPLATES.get(call.name)
    if template is None or any(f not in call.arguments for f in _fields(template)):
        args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
        return f"call {call.name} with {args}" if args else f"call {call.name}"
    used = set(_fields(template))
    text = template.format(**{k: repr(v) for k, v in call.arguments.items() if k in used})
    extra = [f"{k}={v!r}" for k, v in call.arguments.items() if k not in used]
    return text + (" with " + ", ".join(extra) if extra else "")


def verbalize_sequence(calls: list[ToolCall]) -> str:
    """A whole request: the steps joined with ', then ', capitalized, ending with a period."""
    text = ", then ".join(verbalize(c) for c in calls)
    return (text[:1].upper() + text[1:] + ".") if text else ""
