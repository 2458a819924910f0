"""The pickup zones' boroughs, as TLC's taxi zone lookup (taxi_zone_lookup.csv) lists them.

The trips carry the zone's name only; a borough is the location's own lookup of it. Every zone
the landing files can hold is here (``idem_assets.landing.ZONES``), so a zone that is not is new
to the feed, and the borough assets refuse it rather than leave its revenue out.
"""

#: Borough of each pickup zone (TLC zone ids in comments, for checking against the lookup).
BOROUGH_OF_ZONE: dict[str, str] = {
    "Battery Park City": "Manhattan",  # 13
    "Central Park": "Manhattan",  # 43
    "Clinton East": "Manhattan",  # 48
    "East Village": "Manhattan",  # 79
    "Financial District North": "Manhattan",  # 87
    "Gramercy": "Manhattan",  # 107
    "JFK Airport": "Queens",  # 132
    "LaGuardia Airport": "Queens",  # 138
    "Lincoln Square East": "Manhattan",  # 142
    "Midtown Center": "Manhattan",  # 161
    "Midtown East": "Manhattan",  # 162
    "Murray Hill": "Manhattan",  # 170
    # TLC names it "Park Slope"; the feed adds the borough (and a comma for the CSV to quote).
    "Park Slope, Brooklyn": "Brooklyn",  # 181
    "Penn Station/Madison Sq West": "Manhattan",  # 186
    "Times Sq/Theatre District": "Manhattan",  # 230
    "Union Sq": "Manhattan",  # 234
    "Upper East Side North": "Manhattan",  # 236
    "Upper East Side South": "Manhattan",  # 237
    "Upper West Side South": "Manhattan",  # 239
    "West Village": "Manhattan",  # 249
}

#: The boroughs the feed's zones lie in, in the order the UI lists them.
BOROUGHS: tuple[str, ...] = tuple(sorted(set(BOROUGH_OF_ZONE.values())))
